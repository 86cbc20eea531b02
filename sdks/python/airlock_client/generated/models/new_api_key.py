from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="NewApiKey")


@_attrs_define
class NewApiKey:
    """`POST /v1/api-keys`.

    Attributes:
        name (str): 1–64 of `A-Z a-z 0-9 _ - .`, starting with a letter or digit.
    """

    name: str

    def to_dict(self) -> dict[str, Any]:
        name = self.name

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "name": name,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        name = d.pop("name")

        new_api_key = cls(
            name=name,
        )

        return new_api_key
