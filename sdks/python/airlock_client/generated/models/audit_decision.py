from enum import StrEnum


class AuditDecision(StrEnum):
    ALLOWED = "allowed"
    HELD = "held"
    HIDDEN = "hidden"
    REFUSED = "refused"

    def __str__(self) -> str:
        return str(self.value)
