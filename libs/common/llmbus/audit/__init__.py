"""Delivery audit: read a namespace's topics after a run and judge every request sent (see check.py)."""

from llmbus.audit.check import AuditReport, Seen, audit
from llmbus.audit.read import audit_namespace, read_namespace

__all__ = ["AuditReport", "Seen", "audit", "audit_namespace", "read_namespace"]
