from enum import StrEnum


class RuleAccess(StrEnum):
    FULL = "full"
    READ_ONLY = "read-only"
    READ_WRITE = "read-write"

    def __str__(self) -> str:
        return str(self.value)
