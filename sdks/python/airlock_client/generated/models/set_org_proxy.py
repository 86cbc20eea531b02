from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="SetOrgProxy")


@_attrs_define
class SetOrgProxy:
    """`PUT /v1/org/proxy`: the operator proxy the organization's runs go
    through, by one of the names offered (`null`: none); a name not offered
    is refused (422). Runs started from then use it.

        Attributes:
            proxy (None | str | Unset):
    """

    proxy: None | str | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        proxy: None | str | Unset
        if isinstance(self.proxy, Unset):
            proxy = UNSET
        else:
            proxy = self.proxy

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if proxy is not UNSET:
            field_dict["proxy"] = proxy

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)

        def _parse_proxy(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        proxy = _parse_proxy(d.pop("proxy", UNSET))

        set_org_proxy = cls(
            proxy=proxy,
        )

        return set_org_proxy
