from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="PeriodSpend")


@_attrs_define
class PeriodSpend:
    """What a period has spent: settled calls at their usage, calls in flight
    (or whose usage never came) at their reservation.

        Attributes:
            cost_microusd (int):
            period (str): `day:YYYY-MM-DD` or `month:YYYY-MM` (UTC).
            requests (int):
            reserved_cost_microusd (int): Of `cost_microusd`, what is reserved by calls not yet settled.
            reserved_tokens (int): Of `tokens`, what is reserved by calls not yet settled.
            tokens (int):
    """

    cost_microusd: int
    period: str
    requests: int
    reserved_cost_microusd: int
    reserved_tokens: int
    tokens: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        cost_microusd = self.cost_microusd

        period = self.period

        requests = self.requests

        reserved_cost_microusd = self.reserved_cost_microusd

        reserved_tokens = self.reserved_tokens

        tokens = self.tokens

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "cost_microusd": cost_microusd,
                "period": period,
                "requests": requests,
                "reserved_cost_microusd": reserved_cost_microusd,
                "reserved_tokens": reserved_tokens,
                "tokens": tokens,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        cost_microusd = d.pop("cost_microusd")

        period = d.pop("period")

        requests = d.pop("requests")

        reserved_cost_microusd = d.pop("reserved_cost_microusd")

        reserved_tokens = d.pop("reserved_tokens")

        tokens = d.pop("tokens")

        period_spend = cls(
            cost_microusd=cost_microusd,
            period=period,
            requests=requests,
            reserved_cost_microusd=reserved_cost_microusd,
            reserved_tokens=reserved_tokens,
            tokens=tokens,
        )

        period_spend.additional_properties = d
        return period_spend

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
