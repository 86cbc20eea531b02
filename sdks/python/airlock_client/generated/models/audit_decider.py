from enum import StrEnum


class AuditDecider(StrEnum):
    API_KEY = "api_key"
    EGRESS_GUARD = "egress_guard"
    L7_RULE = "l7_rule"
    PERSON = "person"
    TOOL_ALLOWLIST = "tool_allowlist"

    def __str__(self) -> str:
        return str(self.value)
