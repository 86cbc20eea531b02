from enum import StrEnum


class AuditDecision(StrEnum):
    ALLOWED = "allowed"
    CHANGED = "changed"
    HELD = "held"
    HIDDEN = "hidden"
    REFUSED = "refused"

    def __str__(self) -> str:
        return str(self.value)
