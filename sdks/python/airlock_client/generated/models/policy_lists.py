from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.policy_lists_integrations import PolicyListsIntegrations
    from ..models.policy_rule import PolicyRule


T = TypeVar("T", bound="PolicyLists")


@_attrs_define
class PolicyLists:
    """Every rule list of a run: the network list's and each integration's
    (by namespace).

        Attributes:
            integrations (PolicyListsIntegrations | Unset):
            network (list[PolicyRule] | Unset):
    """

    integrations: PolicyListsIntegrations | Unset = UNSET
    network: list[PolicyRule] | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        integrations: dict[str, Any] | Unset = UNSET
        if not isinstance(self.integrations, Unset):
            integrations = self.integrations.to_dict()

        network: list[dict[str, Any]] | Unset = UNSET
        if not isinstance(self.network, Unset):
            network = []
            for network_item_data in self.network:
                network_item = network_item_data.to_dict()
                network.append(network_item)

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if integrations is not UNSET:
            field_dict["integrations"] = integrations
        if network is not UNSET:
            field_dict["network"] = network

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.policy_lists_integrations import PolicyListsIntegrations
        from ..models.policy_rule import PolicyRule

        d = dict(src_dict)
        _integrations = d.pop("integrations", UNSET)
        integrations: PolicyListsIntegrations | Unset
        if isinstance(_integrations, Unset):
            integrations = UNSET
        else:
            integrations = PolicyListsIntegrations.from_dict(_integrations)

        _network = d.pop("network", UNSET)
        network: list[PolicyRule] | Unset = UNSET
        if _network is not UNSET:
            network = []
            for network_item_data in _network:
                network_item = PolicyRule.from_dict(network_item_data)

                network.append(network_item)

        policy_lists = cls(
            integrations=integrations,
            network=network,
        )

        return policy_lists
