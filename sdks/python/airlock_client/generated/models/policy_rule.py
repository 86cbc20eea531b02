from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..models.rule_access import RuleAccess
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.policy_rule_query_type_0 import PolicyRuleQueryType0


T = TypeVar("T", bound="PolicyRule")


@_attrs_define
class PolicyRule:
    """One L7 rule, in the manifest's grammar (docs/egress.md, "L7 rules").

    Attributes:
        host (str): `scheme://host[:port]`, wildcards as in `authorized_uris`.
        access (None | RuleAccess | Unset):
        id (None | str | Unset): Named in refusals and records (default `rules[N]`). Omitted when absent.
        methods (list[str] | Unset): Omitted when empty.
        paths (list[str] | Unset): Path patterns; default `["/**"]`. Omitted when empty.
        query (None | PolicyRuleQueryType0 | Unset): `"any"` (the default), `"none"`, or the parameter names allowed.
            Omitted when absent.
    """

    host: str
    access: None | RuleAccess | Unset = UNSET
    id: None | str | Unset = UNSET
    methods: list[str] | Unset = UNSET
    paths: list[str] | Unset = UNSET
    query: None | PolicyRuleQueryType0 | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.policy_rule_query_type_0 import PolicyRuleQueryType0

        host = self.host

        access: None | str | Unset
        if isinstance(self.access, Unset):
            access = UNSET
        elif isinstance(self.access, RuleAccess):
            access = self.access.value
        else:
            access = self.access

        id: None | str | Unset
        if isinstance(self.id, Unset):
            id = UNSET
        else:
            id = self.id

        methods: list[str] | Unset = UNSET
        if not isinstance(self.methods, Unset):
            methods = self.methods

        paths: list[str] | Unset = UNSET
        if not isinstance(self.paths, Unset):
            paths = self.paths

        query: dict[str, Any] | None | Unset
        if isinstance(self.query, Unset):
            query = UNSET
        elif isinstance(self.query, PolicyRuleQueryType0):
            query = self.query.to_dict()
        else:
            query = self.query

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "host": host,
            }
        )
        if access is not UNSET:
            field_dict["access"] = access
        if id is not UNSET:
            field_dict["id"] = id
        if methods is not UNSET:
            field_dict["methods"] = methods
        if paths is not UNSET:
            field_dict["paths"] = paths
        if query is not UNSET:
            field_dict["query"] = query

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.policy_rule_query_type_0 import PolicyRuleQueryType0

        d = dict(src_dict)
        host = d.pop("host")

        def _parse_access(data: object) -> None | RuleAccess | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                access_type_1 = RuleAccess(data)

                return access_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | RuleAccess | Unset, data)

        access = _parse_access(d.pop("access", UNSET))

        def _parse_id(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        id = _parse_id(d.pop("id", UNSET))

        methods = cast(list[str], d.pop("methods", UNSET))

        paths = cast(list[str], d.pop("paths", UNSET))

        def _parse_query(data: object) -> None | PolicyRuleQueryType0 | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                query_type_0 = PolicyRuleQueryType0.from_dict(data)

                return query_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | PolicyRuleQueryType0 | Unset, data)

        query = _parse_query(d.pop("query", UNSET))

        policy_rule = cls(
            host=host,
            access=access,
            id=id,
            methods=methods,
            paths=paths,
            query=query,
        )

        return policy_rule
