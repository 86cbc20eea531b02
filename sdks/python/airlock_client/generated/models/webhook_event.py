from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.webhook_event_data import WebhookEventData


T = TypeVar("T", bound="WebhookEvent")


@_attrs_define
class WebhookEvent:
    """The body a webhook delivery POSTs (signed: `Airlock-Signature`).

    Attributes:
        created_at (int):
        data (WebhookEventData):
        id (str): The delivery's id (`Airlock-Delivery`), the same on every retry.
        type_ (str): One of the webhook events.
    """

    created_at: int
    data: WebhookEventData
    id: str
    type_: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        created_at = self.created_at

        data = self.data.to_dict()

        id = self.id

        type_ = self.type_

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "created_at": created_at,
                "data": data,
                "id": id,
                "type": type_,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.webhook_event_data import WebhookEventData

        d = dict(src_dict)
        created_at = d.pop("created_at")

        data = WebhookEventData.from_dict(d.pop("data"))

        id = d.pop("id")

        type_ = d.pop("type")

        webhook_event = cls(
            created_at=created_at,
            data=data,
            id=id,
            type_=type_,
        )

        webhook_event.additional_properties = d
        return webhook_event

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
