from enum import StrEnum


class BudgetThresholdBudget(StrEnum):
    ORG_DAY = "org_day"
    ORG_MONTH = "org_month"
    RUN = "run"

    def __str__(self) -> str:
        return str(self.value)
