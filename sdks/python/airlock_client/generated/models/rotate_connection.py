from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.rotate_connection_fields import RotateConnectionFields


T = TypeVar("T", bound="RotateConnection")


@_attrs_define
class RotateConnection:
    """`PUT /v1/connections/{name}`: the new secret (a rotation).

    Attributes:
        fields (RotateConnectionFields):
    """

    fields: RotateConnectionFields

    def to_dict(self) -> dict[str, Any]:
        fields = self.fields.to_dict()

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "fields": fields,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.rotate_connection_fields import RotateConnectionFields

        d = dict(src_dict)
        fields = RotateConnectionFields.from_dict(d.pop("fields"))

        rotate_connection = cls(
            fields=fields,
        )

        return rotate_connection
