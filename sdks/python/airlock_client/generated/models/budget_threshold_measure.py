from enum import StrEnum


class BudgetThresholdMeasure(StrEnum):
    COST_MICROUSD = "cost_microusd"
    REQUESTS = "requests"
    TOKENS = "tokens"

    def __str__(self) -> str:
        return str(self.value)
