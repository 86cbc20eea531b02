from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.artifact_refused_type_0 import ArtifactRefusedType0
from ..types import UNSET, Unset

T = TypeVar("T", bound="Artifact")


@_attrs_define
class Artifact:
    """A file the run's agent left in its output directory (`agent.outputs`).

    Attributes:
        bytes_ (int): Its size as the agent left it.
        created_at (int):
        path (str): Relative to the output directory.
        download_expires_at (int | None | Unset): When `download_url` stops working (Unix seconds).
        download_url (None | str | Unset): A short-lived signed URL to download it (no API key needed while it
            lasts); `null` when it was not stored.
        refused (ArtifactRefusedType0 | None | Unset): why it was not stored; null: stored, downloadable
    """

    bytes_: int
    created_at: int
    path: str
    download_expires_at: int | None | Unset = UNSET
    download_url: None | str | Unset = UNSET
    refused: ArtifactRefusedType0 | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        bytes_ = self.bytes_

        created_at = self.created_at

        path = self.path

        download_expires_at: int | None | Unset
        if isinstance(self.download_expires_at, Unset):
            download_expires_at = UNSET
        else:
            download_expires_at = self.download_expires_at

        download_url: None | str | Unset
        if isinstance(self.download_url, Unset):
            download_url = UNSET
        else:
            download_url = self.download_url

        refused: None | str | Unset
        if isinstance(self.refused, Unset):
            refused = UNSET
        elif isinstance(self.refused, ArtifactRefusedType0):
            refused = self.refused.value
        else:
            refused = self.refused

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "bytes": bytes_,
                "created_at": created_at,
                "path": path,
            }
        )
        if download_expires_at is not UNSET:
            field_dict["download_expires_at"] = download_expires_at
        if download_url is not UNSET:
            field_dict["download_url"] = download_url
        if refused is not UNSET:
            field_dict["refused"] = refused

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        bytes_ = d.pop("bytes")

        created_at = d.pop("created_at")

        path = d.pop("path")

        def _parse_download_expires_at(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        download_expires_at = _parse_download_expires_at(
            d.pop("download_expires_at", UNSET)
        )

        def _parse_download_url(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        download_url = _parse_download_url(d.pop("download_url", UNSET))

        def _parse_refused(data: object) -> ArtifactRefusedType0 | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                refused_type_0 = ArtifactRefusedType0(data)

                return refused_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(ArtifactRefusedType0 | None | Unset, data)

        refused = _parse_refused(d.pop("refused", UNSET))

        artifact = cls(
            bytes_=bytes_,
            created_at=created_at,
            path=path,
            download_expires_at=download_expires_at,
            download_url=download_url,
            refused=refused,
        )

        artifact.additional_properties = d
        return artifact

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
