from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.run_status import RunStatus
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.cost import Cost
    from ..models.run_budget import RunBudget


T = TypeVar("T", bound="Run")


@_attrs_define
class Run:
    """A run. Also the `end` event of an event stream, and a webhook's `data.run`.

    Attributes:
        agent (str):
        backend (str):
        cost (Cost): Tokens and cost metered by a run's model relay.
        created_at (int):
        id (str):
        status (RunStatus): queued and running, then the state it ended in
        budget (RunBudget | Unset): A run's model budget: the limits it is held to (its manifest's
            `[budget]` within the operator's ceilings; `null`: not limited) and what
            it spent against them. Its organization's budgets are `GET /v1/org/budget`'s.
        ended_at (int | None | Unset):
        error (None | str | Unset):
        exit_code (int | None | Unset):
        model (None | str | Unset): The model provider its manifest names.
        pending_approvals (int | None | Unset): While running: how many of its requests an `ask` rule holds for a
            person's answer (`0` included; omitted otherwise). Answered at
            `/v1/runs/{id}/approvals`.
        proxy (None | str | Unset): The upstream proxy its guarded connections went through: an
            operator proxy's name, `PROXY_URL`, or `null` (direct, or not
            started). Never a URL.
        queue_position (int | None | Unset): While queued: how many queued runs are ahead (omitted otherwise).
        replica (None | str | Unset): The `airlock serve` replica that runs (or ran) it.
        sandbox_up_at (int | None | Unset): When its sandbox was up (Unix ms; `null`: not reached).
        sidecar_up_at (int | None | Unset): When its sidecar was ready and its agent let go (Unix ms; `null`: not
            reached).
        started_at (int | None | Unset):
    """

    agent: str
    backend: str
    cost: Cost
    created_at: int
    id: str
    status: RunStatus
    budget: RunBudget | Unset = UNSET
    ended_at: int | None | Unset = UNSET
    error: None | str | Unset = UNSET
    exit_code: int | None | Unset = UNSET
    model: None | str | Unset = UNSET
    pending_approvals: int | None | Unset = UNSET
    proxy: None | str | Unset = UNSET
    queue_position: int | None | Unset = UNSET
    replica: None | str | Unset = UNSET
    sandbox_up_at: int | None | Unset = UNSET
    sidecar_up_at: int | None | Unset = UNSET
    started_at: int | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        agent = self.agent

        backend = self.backend

        cost = self.cost.to_dict()

        created_at = self.created_at

        id = self.id

        status = self.status.value

        budget: dict[str, Any] | Unset = UNSET
        if not isinstance(self.budget, Unset):
            budget = self.budget.to_dict()

        ended_at: int | None | Unset
        if isinstance(self.ended_at, Unset):
            ended_at = UNSET
        else:
            ended_at = self.ended_at

        error: None | str | Unset
        if isinstance(self.error, Unset):
            error = UNSET
        else:
            error = self.error

        exit_code: int | None | Unset
        if isinstance(self.exit_code, Unset):
            exit_code = UNSET
        else:
            exit_code = self.exit_code

        model: None | str | Unset
        if isinstance(self.model, Unset):
            model = UNSET
        else:
            model = self.model

        pending_approvals: int | None | Unset
        if isinstance(self.pending_approvals, Unset):
            pending_approvals = UNSET
        else:
            pending_approvals = self.pending_approvals

        proxy: None | str | Unset
        if isinstance(self.proxy, Unset):
            proxy = UNSET
        else:
            proxy = self.proxy

        queue_position: int | None | Unset
        if isinstance(self.queue_position, Unset):
            queue_position = UNSET
        else:
            queue_position = self.queue_position

        replica: None | str | Unset
        if isinstance(self.replica, Unset):
            replica = UNSET
        else:
            replica = self.replica

        sandbox_up_at: int | None | Unset
        if isinstance(self.sandbox_up_at, Unset):
            sandbox_up_at = UNSET
        else:
            sandbox_up_at = self.sandbox_up_at

        sidecar_up_at: int | None | Unset
        if isinstance(self.sidecar_up_at, Unset):
            sidecar_up_at = UNSET
        else:
            sidecar_up_at = self.sidecar_up_at

        started_at: int | None | Unset
        if isinstance(self.started_at, Unset):
            started_at = UNSET
        else:
            started_at = self.started_at

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "agent": agent,
                "backend": backend,
                "cost": cost,
                "created_at": created_at,
                "id": id,
                "status": status,
            }
        )
        if budget is not UNSET:
            field_dict["budget"] = budget
        if ended_at is not UNSET:
            field_dict["ended_at"] = ended_at
        if error is not UNSET:
            field_dict["error"] = error
        if exit_code is not UNSET:
            field_dict["exit_code"] = exit_code
        if model is not UNSET:
            field_dict["model"] = model
        if pending_approvals is not UNSET:
            field_dict["pending_approvals"] = pending_approvals
        if proxy is not UNSET:
            field_dict["proxy"] = proxy
        if queue_position is not UNSET:
            field_dict["queue_position"] = queue_position
        if replica is not UNSET:
            field_dict["replica"] = replica
        if sandbox_up_at is not UNSET:
            field_dict["sandbox_up_at"] = sandbox_up_at
        if sidecar_up_at is not UNSET:
            field_dict["sidecar_up_at"] = sidecar_up_at
        if started_at is not UNSET:
            field_dict["started_at"] = started_at

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.cost import Cost
        from ..models.run_budget import RunBudget

        d = dict(src_dict)
        agent = d.pop("agent")

        backend = d.pop("backend")

        cost = Cost.from_dict(d.pop("cost"))

        created_at = d.pop("created_at")

        id = d.pop("id")

        status = RunStatus(d.pop("status"))

        _budget = d.pop("budget", UNSET)
        budget: RunBudget | Unset
        if isinstance(_budget, Unset):
            budget = UNSET
        else:
            budget = RunBudget.from_dict(_budget)

        def _parse_ended_at(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        ended_at = _parse_ended_at(d.pop("ended_at", UNSET))

        def _parse_error(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        error = _parse_error(d.pop("error", UNSET))

        def _parse_exit_code(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        exit_code = _parse_exit_code(d.pop("exit_code", UNSET))

        def _parse_model(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        model = _parse_model(d.pop("model", UNSET))

        def _parse_pending_approvals(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        pending_approvals = _parse_pending_approvals(d.pop("pending_approvals", UNSET))

        def _parse_proxy(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        proxy = _parse_proxy(d.pop("proxy", UNSET))

        def _parse_queue_position(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        queue_position = _parse_queue_position(d.pop("queue_position", UNSET))

        def _parse_replica(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        replica = _parse_replica(d.pop("replica", UNSET))

        def _parse_sandbox_up_at(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        sandbox_up_at = _parse_sandbox_up_at(d.pop("sandbox_up_at", UNSET))

        def _parse_sidecar_up_at(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        sidecar_up_at = _parse_sidecar_up_at(d.pop("sidecar_up_at", UNSET))

        def _parse_started_at(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        started_at = _parse_started_at(d.pop("started_at", UNSET))

        run = cls(
            agent=agent,
            backend=backend,
            cost=cost,
            created_at=created_at,
            id=id,
            status=status,
            budget=budget,
            ended_at=ended_at,
            error=error,
            exit_code=exit_code,
            model=model,
            pending_approvals=pending_approvals,
            proxy=proxy,
            queue_position=queue_position,
            replica=replica,
            sandbox_up_at=sandbox_up_at,
            sidecar_up_at=sidecar_up_at,
            started_at=started_at,
        )

        run.additional_properties = d
        return run

    @property
    def additional_keys(self) -> list[str]:
        return list(self.additional_properties.keys())

    def __getitem__(self, key: str) -> Any:
        return self.additional_properties[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.additional_properties[key] = value

    def __delitem__(self, key: str) -> None:
        del self.additional_properties[key]

    def __contains__(self, key: str) -> bool:
        return key in self.additional_properties
