from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

T = TypeVar("T", bound="OrgProxy")


@_attrs_define
class OrgProxy:
    """`GET /v1/org/proxy`: the upstream proxy the organization's runs go
    through, by name (never a URL: a proxy's URL may hold credentials).

        Attributes:
            offered (list[str]): The operator's proxies (`SYSTEM_PROXIES`) the organization may choose.
            proxy (None | str | Unset): The name it chose (`null`: none; its runs use the operator's
                default proxy, `PROXY_URL`, or go direct).
    """

    offered: list[str]
    proxy: None | str | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        offered = self.offered

        proxy: None | str | Unset
        if isinstance(self.proxy, Unset):
            proxy = UNSET
        else:
            proxy = self.proxy

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "offered": offered,
            }
        )
        if proxy is not UNSET:
            field_dict["proxy"] = proxy

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        offered = cast(list[str], d.pop("offered"))

        def _parse_proxy(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        proxy = _parse_proxy(d.pop("proxy", UNSET))

        org_proxy = cls(
            offered=offered,
            proxy=proxy,
        )

        org_proxy.additional_properties = d
        return org_proxy

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
