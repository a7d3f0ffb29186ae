"""The workloads of `benchmarks/suffix.py` (and its replays): specgen's bundled
requests, and an agent-like one, a ticket-triage template over 24 tickets, sent
in sequence as an agent would send them.

    python benchmarks/workloads.py agent [--jsonl]

lists a workload's requests (id and prompt length; --jsonl: the requests as a
request file for `specgen bench FILE`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# The agent workload's template describes the answer's shape in words only: the
# JSON the model writes (keys in order, quoting, separators) is in no prompt, so
# only earlier requests' outputs hold it -- what a cross-request index is for.
# AGENT_EXAMPLE_TEMPLATE (workload agent-example) adds a worked example, whose
# answer puts that shape in every prompt: the local index copies it already.
AGENT_TEMPLATE = """You are a support-ticket triage agent for Northwind Cloud. Read the ticket and answer with one JSON object with the keys "category" (one of: billing, bug, account, feature_request, outage, other), "priority" (low, medium, high, urgent), "product" (storage, compute, database, dashboard, api, billing_portal), "customer_tier" (free, pro, enterprise), "summary" (one short sentence), and "next_action" (one of: refund_review, escalate_engineering, reset_credentials, add_to_roadmap, status_page_update, reply_with_docs).

Ticket: "{ticket}"
Answer: {"category": \""""

AGENT_EXAMPLE_TEMPLATE = """You are a support-ticket triage agent for Northwind Cloud. Read the ticket and answer with one JSON object with the keys "category" (one of: billing, bug, account, feature_request, outage, other), "priority" (low, medium, high, urgent), "product" (storage, compute, database, dashboard, api, billing_portal), "customer_tier" (free, pro, enterprise), "summary" (one short sentence), and "next_action" (one of: refund_review, escalate_engineering, reset_credentials, add_to_roadmap, status_page_update, reply_with_docs).

Ticket: "Hi, I'm on the Pro plan and I was charged twice for November. Please fix this, I only have one workspace." - Dana
Answer: {"category": "billing", "priority": "medium", "product": "billing_portal", "customer_tier": "pro", "summary": "Customer was charged twice for November on the Pro plan.", "next_action": "refund_review"}

Ticket: "{ticket}"
Answer: {"category": \""""

TICKETS = [
    "Our enterprise database cluster in eu-west has been unreachable for 20 minutes. Production is down! - Raj, Enterprise",
    "The dashboard shows my storage usage as 0 bytes but I have 40 GB of files. Free plan. - Lena",
    "Can you add dark mode to the dashboard? Our team works at night. - Pro customer Tom",
    "I forgot my password and the reset email never arrives. I'm on the free tier. - Mei",
    "API returns 500 on every POST /v2/jobs since this morning. We are an enterprise customer. - Carlos",
    "I was billed for the Enterprise plan but we downgraded to Pro last month. - Fatima",
    "Compute instances take 10 minutes to boot instead of 30 seconds. Pro plan. - Ivan",
    "Please support exporting invoices as CSV from the billing portal. - Enterprise admin Noor",
    "Someone logged into my account from another country. Please lock it! Free plan. - Sam",
    "Database backups failed three nights in a row, error code DB-4411. Enterprise. - Olga",
    "How do I rotate API keys without downtime? Pro plan. - Kenji",
    "The storage upload button does nothing in Firefox. Free tier user. - Ana",
    "We need SSO with Okta for our 300 users. Enterprise. - Priya",
    "My credit card was declined but the bank says it is fine. Pro. - Luis",
    "All compute regions show red on your status page but our VMs work. Enterprise. - Hannah",
    "The API rate limit is 10 requests per second but our contract says 100. Enterprise. - Omar",
    "I can't change the email address on my account. Free plan. - Zoe",
    "Storage bucket listing is very slow for buckets with more than a million objects. Pro. - Ben",
    "Please add a Terraform provider for the database product. Pro customer. - Ines",
    "We were charged VAT although we entered our EU VAT number. Enterprise. - Jonas",
    "Dashboard graphs are empty since the last release. Pro plan. - Aisha",
    "Our database failover took 15 minutes during the incident yesterday; we need an explanation. Enterprise. - Ravi",
    "Two-factor codes from the authenticator app are always rejected. Pro. - Elif",
    "Compute billing shows hours for instances we deleted last week. Free tier. - Marco",
]


def agent_requests(template: str = AGENT_TEMPLATE) -> list[tuple[str, str]]:
    return [(f"ticket-{i:02d}", template.replace("{ticket}", t)) for i, t in enumerate(TICKETS)]


def agent_example_requests() -> list[tuple[str, str]]:
    return agent_requests(AGENT_EXAMPLE_TEMPLATE)


def bundled_requests() -> list[tuple[str, str]]:
    from specgen.bench import load_requests

    return [(r.id, r.prompt) for r in load_requests(None) if r.prompt]


WORKLOADS = {"bundled": bundled_requests, "agent": agent_requests, "agent-example": agent_example_requests}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=list(WORKLOADS))
    ap.add_argument("--jsonl", action="store_true", help="print the requests as JSON lines ({id, category, prompt})")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's specgen
    for rid, prompt in WORKLOADS[args.workload]():
        if args.jsonl:
            print(json.dumps({"id": rid, "category": args.workload, "prompt": prompt}))
        else:
            print(f"{rid}\t{len(prompt)} chars")


if __name__ == "__main__":
    main()
