from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.cost_call import CostCall


T = TypeVar("T", bound="RunCost")


@_attrs_define
class RunCost:
    """A run's metered usage: its totals, and each model call with the key
    that paid for it.

        Attributes:
            calls (list[CostCall]): Each metered model call, in the order recorded (at most the first
                10,000).
            cost_microusd (int): The run's totals, as [`Cost`] (its fields, flat: an answer's fields
                are its schema's own properties).
            cost_usd (float):
            tokens_in (int):
            tokens_out (int):
    """

    calls: list[CostCall]
    cost_microusd: int
    cost_usd: float
    tokens_in: int
    tokens_out: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        calls = []
        for calls_item_data in self.calls:
            calls_item = calls_item_data.to_dict()
            calls.append(calls_item)

        cost_microusd = self.cost_microusd

        cost_usd = self.cost_usd

        tokens_in = self.tokens_in

        tokens_out = self.tokens_out

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "calls": calls,
                "cost_microusd": cost_microusd,
                "cost_usd": cost_usd,
                "tokens_in": tokens_in,
                "tokens_out": tokens_out,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.cost_call import CostCall

        d = dict(src_dict)
        calls = []
        _calls = d.pop("calls")
        for calls_item_data in _calls:
            calls_item = CostCall.from_dict(calls_item_data)

            calls.append(calls_item)

        cost_microusd = d.pop("cost_microusd")

        cost_usd = d.pop("cost_usd")

        tokens_in = d.pop("tokens_in")

        tokens_out = d.pop("tokens_out")

        run_cost = cls(
            calls=calls,
            cost_microusd=cost_microusd,
            cost_usd=cost_usd,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
        )

        run_cost.additional_properties = d
        return run_cost

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
