from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.budget_limits import BudgetLimits
    from ..models.period_spend import PeriodSpend


T = TypeVar("T", bound="OrgBudget")


@_attrs_define
class OrgBudget:
    """The organization's model budgets and what today and this month spent.

    Attributes:
        day (BudgetLimits): A budget period's limits on the organization's model calls; `null`:
            that measure is not limited. Every limit is at least 1.
        day_spend (PeriodSpend): What a period has spent: settled calls at their usage, calls in flight
            (or whose usage never came) at their reservation.
        month (BudgetLimits): A budget period's limits on the organization's model calls; `null`:
            that measure is not limited. Every limit is at least 1.
        month_spend (PeriodSpend): What a period has spent: settled calls at their usage, calls in flight
            (or whose usage never came) at their reservation.
        thresholds (list[float] | Unset): The fractions of each budget at which a `budget.threshold` webhook
            event is sent, ascending.
    """

    day: BudgetLimits
    day_spend: PeriodSpend
    month: BudgetLimits
    month_spend: PeriodSpend
    thresholds: list[float] | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        day = self.day.to_dict()

        day_spend = self.day_spend.to_dict()

        month = self.month.to_dict()

        month_spend = self.month_spend.to_dict()

        thresholds: list[float] | Unset = UNSET
        if not isinstance(self.thresholds, Unset):
            thresholds = self.thresholds

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "day": day,
                "day_spend": day_spend,
                "month": month,
                "month_spend": month_spend,
            }
        )
        if thresholds is not UNSET:
            field_dict["thresholds"] = thresholds

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.budget_limits import BudgetLimits
        from ..models.period_spend import PeriodSpend

        d = dict(src_dict)
        day = BudgetLimits.from_dict(d.pop("day"))

        day_spend = PeriodSpend.from_dict(d.pop("day_spend"))

        month = BudgetLimits.from_dict(d.pop("month"))

        month_spend = PeriodSpend.from_dict(d.pop("month_spend"))

        thresholds = cast(list[float], d.pop("thresholds", UNSET))

        org_budget = cls(
            day=day,
            day_spend=day_spend,
            month=month,
            month_spend=month_spend,
            thresholds=thresholds,
        )

        org_budget.additional_properties = d
        return org_budget

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
