from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

T = TypeVar("T", bound="Agent")


@_attrs_define
class Agent:
    """
    Attributes:
        created_at (int):
        files (list[str]): The paths of its files.
        name (str):
        updated_at (int):
        manifest (None | str | Unset): The manifest's text: `GET /v1/agents/{name}` only (omitted elsewhere).
    """

    created_at: int
    files: list[str]
    name: str
    updated_at: int
    manifest: None | str | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        created_at = self.created_at

        files = self.files

        name = self.name

        updated_at = self.updated_at

        manifest: None | str | Unset
        if isinstance(self.manifest, Unset):
            manifest = UNSET
        else:
            manifest = self.manifest

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "created_at": created_at,
                "files": files,
                "name": name,
                "updated_at": updated_at,
            }
        )
        if manifest is not UNSET:
            field_dict["manifest"] = manifest

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        created_at = d.pop("created_at")

        files = cast(list[str], d.pop("files"))

        name = d.pop("name")

        updated_at = d.pop("updated_at")

        def _parse_manifest(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        manifest = _parse_manifest(d.pop("manifest", UNSET))

        agent = cls(
            created_at=created_at,
            files=files,
            name=name,
            updated_at=updated_at,
            manifest=manifest,
        )

        agent.additional_properties = d
        return agent

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
