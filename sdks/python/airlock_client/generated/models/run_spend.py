from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="RunSpend")


@_attrs_define
class RunSpend:
    """What a run's model calls spent: tokens input and output together,
    cost at the model's prices, metered requests.

        Attributes:
            cost_microusd (int): Millionths of a US dollar.
            requests (int):
            tokens (int):
    """

    cost_microusd: int
    requests: int
    tokens: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        cost_microusd = self.cost_microusd

        requests = self.requests

        tokens = self.tokens

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "cost_microusd": cost_microusd,
                "requests": requests,
                "tokens": tokens,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        cost_microusd = d.pop("cost_microusd")

        requests = d.pop("requests")

        tokens = d.pop("tokens")

        run_spend = cls(
            cost_microusd=cost_microusd,
            requests=requests,
            tokens=tokens,
        )

        run_spend.additional_properties = d
        return run_spend

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
