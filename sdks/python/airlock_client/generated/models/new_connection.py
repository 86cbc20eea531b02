from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define

from ..models.new_connection_type import NewConnectionType

if TYPE_CHECKING:
    from ..models.new_connection_fields import NewConnectionFields


T = TypeVar("T", bound="NewConnection")


@_attrs_define
class NewConnection:
    """`POST /v1/connections`: a credential, stored encrypted; no route returns it.

    Attributes:
        fields (NewConnectionFields): The credential's fields (which ones: by its type).
        integration (str):
        name (str):
        type_ (NewConnectionType): how the credential is presented upstream
    """

    fields: NewConnectionFields
    integration: str
    name: str
    type_: NewConnectionType

    def to_dict(self) -> dict[str, Any]:
        fields = self.fields.to_dict()

        integration = self.integration

        name = self.name

        type_ = self.type_.value

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "fields": fields,
                "integration": integration,
                "name": name,
                "type": type_,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.new_connection_fields import NewConnectionFields

        d = dict(src_dict)
        fields = NewConnectionFields.from_dict(d.pop("fields"))

        integration = d.pop("integration")

        name = d.pop("name")

        type_ = NewConnectionType(d.pop("type"))

        new_connection = cls(
            fields=fields,
            integration=integration,
            name=name,
            type_=type_,
        )

        return new_connection
