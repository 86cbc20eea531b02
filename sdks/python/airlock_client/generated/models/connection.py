from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.connection_type import ConnectionType

T = TypeVar("T", bound="Connection")


@_attrs_define
class Connection:
    """A connection (never its secret).

    Attributes:
        created_at (int):
        integration (str):
        kid (str): The id of the key its secret is encrypted under.
        name (str):
        type_ (ConnectionType): how the credential is presented upstream
        updated_at (int):
    """

    created_at: int
    integration: str
    kid: str
    name: str
    type_: ConnectionType
    updated_at: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        created_at = self.created_at

        integration = self.integration

        kid = self.kid

        name = self.name

        type_ = self.type_.value

        updated_at = self.updated_at

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "created_at": created_at,
                "integration": integration,
                "kid": kid,
                "name": name,
                "type": type_,
                "updated_at": updated_at,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        created_at = d.pop("created_at")

        integration = d.pop("integration")

        kid = d.pop("kid")

        name = d.pop("name")

        type_ = ConnectionType(d.pop("type"))

        updated_at = d.pop("updated_at")

        connection = cls(
            created_at=created_at,
            integration=integration,
            kid=kid,
            name=name,
            type_=type_,
            updated_at=updated_at,
        )

        connection.additional_properties = d
        return connection

    @property
    def additional_keys(self) -> list[str]:
        return list(self.additional_properties.keys())

    def __getitem__(self, key: str) -> Any:
        return self.additional_properties[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.additional_properties[key] = value

    def __delitem__(self, key: str) -> None:
        del self.additional_properties[key]

    def __contains__(self, key: str) -> bool:
        return key in self.additional_properties
