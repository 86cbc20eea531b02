from enum import StrEnum


class AuditDecision(StrEnum):
    ALLOWED = "allowed"
    HIDDEN = "hidden"
    REFUSED = "refused"

    def __str__(self) -> str:
        return str(self.value)
