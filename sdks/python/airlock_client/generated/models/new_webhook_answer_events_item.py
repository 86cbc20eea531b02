from enum import StrEnum


class NewWebhookAnswerEventsItem(StrEnum):
    APPROVAL_PENDING = "approval.pending"
    APPROVAL_SETTLED = "approval.settled"
    BUDGET_THRESHOLD = "budget.threshold"
    RUN_CANCELLED = "run.cancelled"
    RUN_FAILED = "run.failed"
    RUN_STARTED = "run.started"
    RUN_SUCCEEDED = "run.succeeded"
    RUN_TIMED_OUT = "run.timed_out"

    def __str__(self) -> str:
        return str(self.value)
