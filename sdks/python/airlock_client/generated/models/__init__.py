"""Contains all the data models used in inputs/outputs"""

from .agent import Agent
from .agent_list import AgentList
from .answer_approval import AnswerApproval
from .api_key import ApiKey
from .api_key_list import ApiKeyList
from .approval import Approval
from .approval_decision import ApprovalDecision
from .approval_list import ApprovalList
from .approval_state import ApprovalState
from .artifact import Artifact
from .artifact_list import ArtifactList
from .artifact_refused_type_0 import ArtifactRefusedType0
from .audit_decider import AuditDecider
from .audit_decision import AuditDecision
from .audit_kind import AuditKind
from .audit_record import AuditRecord
from .budget_limits import BudgetLimits
from .budget_threshold import BudgetThreshold
from .budget_threshold_budget import BudgetThresholdBudget
from .budget_threshold_measure import BudgetThresholdMeasure
from .connection import Connection
from .connection_list import ConnectionList
from .connection_type import ConnectionType
from .cost import Cost
from .cost_call import CostCall
from .delivery import Delivery
from .delivery_list import DeliveryList
from .delivery_state import DeliveryState
from .egress_log import EgressLog
from .egress_record import EgressRecord
from .egress_record_plane import EgressRecordPlane
from .error import Error
from .error_detail import ErrorDetail
from .event import Event
from .event_page import EventPage
from .event_payload import EventPayload
from .get_run_audit_format import GetRunAuditFormat
from .health import Health
from .jwk import Jwk
from .jwks import Jwks
from .new_api_key import NewApiKey
from .new_api_key_answer import NewApiKeyAnswer
from .new_connection import NewConnection
from .new_connection_fields import NewConnectionFields
from .new_connection_type import NewConnectionType
from .new_run import NewRun
from .new_run_files import NewRunFiles
from .new_webhook import NewWebhook
from .new_webhook_answer import NewWebhookAnswer
from .new_webhook_answer_events_item import NewWebhookAnswerEventsItem
from .new_webhook_events_item import NewWebhookEventsItem
from .open_id_configuration import OpenIdConfiguration
from .org_budget import OrgBudget
from .org_proxy import OrgProxy
from .organization import Organization
from .period_spend import PeriodSpend
from .policy_lists import PolicyLists
from .policy_lists_integrations import PolicyListsIntegrations
from .policy_rule import PolicyRule
from .policy_rule_query_type_0 import PolicyRuleQueryType0
from .ready import Ready
from .register_agent import RegisterAgent
from .register_agent_files import RegisterAgentFiles
from .rotate_connection import RotateConnection
from .rotate_connection_fields import RotateConnectionFields
from .rule_access import RuleAccess
from .run import Run
from .run_budget import RunBudget
from .run_cost import RunCost
from .run_limits import RunLimits
from .run_list import RunList
from .run_policy import RunPolicy
from .run_spend import RunSpend
from .run_status import RunStatus
from .set_org_budget import SetOrgBudget
from .set_org_proxy import SetOrgProxy
from .set_run_policy import SetRunPolicy
from .webhook import Webhook
from .webhook_event import WebhookEvent
from .webhook_event_data import WebhookEventData
from .webhook_events_item import WebhookEventsItem
from .webhook_list import WebhookList

__all__ = (
    "Agent",
    "AgentList",
    "AnswerApproval",
    "ApiKey",
    "ApiKeyList",
    "Approval",
    "ApprovalDecision",
    "ApprovalList",
    "ApprovalState",
    "Artifact",
    "ArtifactList",
    "ArtifactRefusedType0",
    "AuditDecider",
    "AuditDecision",
    "AuditKind",
    "AuditRecord",
    "BudgetLimits",
    "BudgetThreshold",
    "BudgetThresholdBudget",
    "BudgetThresholdMeasure",
    "Connection",
    "ConnectionList",
    "ConnectionType",
    "Cost",
    "CostCall",
    "Delivery",
    "DeliveryList",
    "DeliveryState",
    "EgressLog",
    "EgressRecord",
    "EgressRecordPlane",
    "Error",
    "ErrorDetail",
    "Event",
    "EventPage",
    "EventPayload",
    "GetRunAuditFormat",
    "Health",
    "Jwk",
    "Jwks",
    "NewApiKey",
    "NewApiKeyAnswer",
    "NewConnection",
    "NewConnectionFields",
    "NewConnectionType",
    "NewRun",
    "NewRunFiles",
    "NewWebhook",
    "NewWebhookAnswer",
    "NewWebhookAnswerEventsItem",
    "NewWebhookEventsItem",
    "OpenIdConfiguration",
    "OrgBudget",
    "OrgProxy",
    "Organization",
    "PeriodSpend",
    "PolicyLists",
    "PolicyListsIntegrations",
    "PolicyRule",
    "PolicyRuleQueryType0",
    "Ready",
    "RegisterAgent",
    "RegisterAgentFiles",
    "RotateConnection",
    "RotateConnectionFields",
    "RuleAccess",
    "Run",
    "RunBudget",
    "RunCost",
    "RunLimits",
    "RunList",
    "RunPolicy",
    "RunSpend",
    "RunStatus",
    "SetOrgBudget",
    "SetOrgProxy",
    "SetRunPolicy",
    "Webhook",
    "WebhookEvent",
    "WebhookEventData",
    "WebhookEventsItem",
    "WebhookList",
)
