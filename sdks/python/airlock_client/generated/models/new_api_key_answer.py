from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

T = TypeVar("T", bound="NewApiKeyAnswer")


@_attrs_define
class NewApiKeyAnswer:
    """A new key's record, with the key: shown in this answer only (only its
    hash is kept).

        Attributes:
            created_at (int):
            id (str):
            key (str): `alk_…`: shown in this answer only.
            name (str):
            revoked_at (int | None | Unset):
    """

    created_at: int
    id: str
    key: str
    name: str
    revoked_at: int | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        created_at = self.created_at

        id = self.id

        key = self.key

        name = self.name

        revoked_at: int | None | Unset
        if isinstance(self.revoked_at, Unset):
            revoked_at = UNSET
        else:
            revoked_at = self.revoked_at

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "created_at": created_at,
                "id": id,
                "key": key,
                "name": name,
            }
        )
        if revoked_at is not UNSET:
            field_dict["revoked_at"] = revoked_at

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        created_at = d.pop("created_at")

        id = d.pop("id")

        key = d.pop("key")

        name = d.pop("name")

        def _parse_revoked_at(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        revoked_at = _parse_revoked_at(d.pop("revoked_at", UNSET))

        new_api_key_answer = cls(
            created_at=created_at,
            id=id,
            key=key,
            name=name,
            revoked_at=revoked_at,
        )

        new_api_key_answer.additional_properties = d
        return new_api_key_answer

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
