from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="Cost")


@_attrs_define
class Cost:
    """Tokens and cost metered by a run's model relay.

    Attributes:
        cost_microusd (int): Millionths of a US dollar.
        cost_usd (float): `cost_microusd` in dollars.
        tokens_in (int):
        tokens_out (int):
    """

    cost_microusd: int
    cost_usd: float
    tokens_in: int
    tokens_out: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        cost_microusd = self.cost_microusd

        cost_usd = self.cost_usd

        tokens_in = self.tokens_in

        tokens_out = self.tokens_out

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "cost_microusd": cost_microusd,
                "cost_usd": cost_usd,
                "tokens_in": tokens_in,
                "tokens_out": tokens_out,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        cost_microusd = d.pop("cost_microusd")

        cost_usd = d.pop("cost_usd")

        tokens_in = d.pop("tokens_in")

        tokens_out = d.pop("tokens_out")

        cost = cls(
            cost_microusd=cost_microusd,
            cost_usd=cost_usd,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
        )

        cost.additional_properties = d
        return cost

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
