from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.register_agent_files import RegisterAgentFiles


T = TypeVar("T", bound="RegisterAgent")


@_attrs_define
class RegisterAgent:
    """`POST /v1/agents`: an agent's manifest and the files of its directory.

    Attributes:
        manifest (str): `airlock.toml`'s text.
        files (RegisterAgentFiles | Unset): Relative path → UTF-8 content.
    """

    manifest: str
    files: RegisterAgentFiles | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        manifest = self.manifest

        files: dict[str, Any] | Unset = UNSET
        if not isinstance(self.files, Unset):
            files = self.files.to_dict()

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "manifest": manifest,
            }
        )
        if files is not UNSET:
            field_dict["files"] = files

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.register_agent_files import RegisterAgentFiles

        d = dict(src_dict)
        manifest = d.pop("manifest")

        _files = d.pop("files", UNSET)
        files: RegisterAgentFiles | Unset
        if isinstance(_files, Unset):
            files = UNSET
        else:
            files = RegisterAgentFiles.from_dict(_files)

        register_agent = cls(
            manifest=manifest,
            files=files,
        )

        return register_agent
