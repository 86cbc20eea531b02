from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.budget_limits import BudgetLimits


T = TypeVar("T", bound="SetOrgBudget")


@_attrs_define
class SetOrgBudget:
    """`PUT /v1/org/budget`: the organization's model budgets per UTC day and
    per UTC month (`{}`: no limit in that period).

        Attributes:
            day (BudgetLimits): A budget period's limits on the organization's model calls; `null`:
                that measure is not limited. Every limit is at least 1.
            month (BudgetLimits): A budget period's limits on the organization's model calls; `null`:
                that measure is not limited. Every limit is at least 1.
    """

    day: BudgetLimits
    month: BudgetLimits

    def to_dict(self) -> dict[str, Any]:
        day = self.day.to_dict()

        month = self.month.to_dict()

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "day": day,
                "month": month,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.budget_limits import BudgetLimits

        d = dict(src_dict)
        day = BudgetLimits.from_dict(d.pop("day"))

        month = BudgetLimits.from_dict(d.pop("month"))

        set_org_budget = cls(
            day=day,
            month=month,
        )

        return set_org_budget
