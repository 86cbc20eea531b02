from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.budget_limits import BudgetLimits


T = TypeVar("T", bound="SetOrgBudget")


@_attrs_define
class SetOrgBudget:
    """`PUT /v1/org/budget`: the organization's model budgets per UTC day and
    per UTC month (`{}`: no limit in that period), and the thresholds at
    which its webhooks hear of each budget's spend.

        Attributes:
            day (BudgetLimits): A budget period's limits on the organization's model calls; `null`:
                that measure is not limited. Every limit is at least 1.
            month (BudgetLimits): A budget period's limits on the organization's model calls; `null`:
                that measure is not limited. Every limit is at least 1.
            thresholds (list[float] | None | Unset): Fractions of each budget (above 0, at most 1, in thousandths, at
                most 10) at which a `budget.threshold` webhook event is sent, for
                the organization's budgets and its runs' own; `[]`: none; omitted or
                `null`: the default, `[0.5, 0.8, 1.0]`.
    """

    day: BudgetLimits
    month: BudgetLimits
    thresholds: list[float] | None | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        day = self.day.to_dict()

        month = self.month.to_dict()

        thresholds: list[float] | None | Unset
        if isinstance(self.thresholds, Unset):
            thresholds = UNSET
        elif isinstance(self.thresholds, list):
            thresholds = self.thresholds

        else:
            thresholds = self.thresholds

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "day": day,
                "month": month,
            }
        )
        if thresholds is not UNSET:
            field_dict["thresholds"] = thresholds

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.budget_limits import BudgetLimits

        d = dict(src_dict)
        day = BudgetLimits.from_dict(d.pop("day"))

        month = BudgetLimits.from_dict(d.pop("month"))

        def _parse_thresholds(data: object) -> list[float] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                thresholds_type_0 = cast(list[float], data)

                return thresholds_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[float] | None | Unset, data)

        thresholds = _parse_thresholds(d.pop("thresholds", UNSET))

        set_org_budget = cls(
            day=day,
            month=month,
            thresholds=thresholds,
        )

        return set_org_budget
