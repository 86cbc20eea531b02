from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.delivery_state import DeliveryState
from ..types import UNSET, Unset

T = TypeVar("T", bound="Delivery")


@_attrs_define
class Delivery:
    """One event to deliver to one webhook, and how its delivery went.

    Attributes:
        attempts (int):
        created_at (int):
        event (str):
        id (str):
        next_attempt_at (int):
        run_id (str):
        state (DeliveryState): failed: given up after the last attempt
        delivered_at (int | None | Unset):
        last_error (None | str | Unset):
        last_status (int | None | Unset): The receiver's last HTTP status.
    """

    attempts: int
    created_at: int
    event: str
    id: str
    next_attempt_at: int
    run_id: str
    state: DeliveryState
    delivered_at: int | None | Unset = UNSET
    last_error: None | str | Unset = UNSET
    last_status: int | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        attempts = self.attempts

        created_at = self.created_at

        event = self.event

        id = self.id

        next_attempt_at = self.next_attempt_at

        run_id = self.run_id

        state = self.state.value

        delivered_at: int | None | Unset
        if isinstance(self.delivered_at, Unset):
            delivered_at = UNSET
        else:
            delivered_at = self.delivered_at

        last_error: None | str | Unset
        if isinstance(self.last_error, Unset):
            last_error = UNSET
        else:
            last_error = self.last_error

        last_status: int | None | Unset
        if isinstance(self.last_status, Unset):
            last_status = UNSET
        else:
            last_status = self.last_status

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "attempts": attempts,
                "created_at": created_at,
                "event": event,
                "id": id,
                "next_attempt_at": next_attempt_at,
                "run_id": run_id,
                "state": state,
            }
        )
        if delivered_at is not UNSET:
            field_dict["delivered_at"] = delivered_at
        if last_error is not UNSET:
            field_dict["last_error"] = last_error
        if last_status is not UNSET:
            field_dict["last_status"] = last_status

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        attempts = d.pop("attempts")

        created_at = d.pop("created_at")

        event = d.pop("event")

        id = d.pop("id")

        next_attempt_at = d.pop("next_attempt_at")

        run_id = d.pop("run_id")

        state = DeliveryState(d.pop("state"))

        def _parse_delivered_at(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        delivered_at = _parse_delivered_at(d.pop("delivered_at", UNSET))

        def _parse_last_error(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        last_error = _parse_last_error(d.pop("last_error", UNSET))

        def _parse_last_status(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        last_status = _parse_last_status(d.pop("last_status", UNSET))

        delivery = cls(
            attempts=attempts,
            created_at=created_at,
            event=event,
            id=id,
            next_attempt_at=next_attempt_at,
            run_id=run_id,
            state=state,
            delivered_at=delivered_at,
            last_error=last_error,
            last_status=last_status,
        )

        delivery.additional_properties = d
        return delivery

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
