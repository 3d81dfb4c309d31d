"""The telecom agent's side: 13 CRM tools on the agent DB, the setup functions tasks use on it
(`set_data_usage`, `suspend_line_for_overdue_bill`) and its assertions. tau2-bench semantics,
our code. Records are the JSON dicts of `telecom_db`; lookups scan the (small) lists.
"""

from __future__ import annotations

import datetime
from typing import Any

from orchestrax.envs.tau2.db import Rejected
from orchestrax.envs.tau2.functions import DomainFunction, i, obj, s
from orchestrax.envs.tau2.functions import named as _f
from orchestrax.envs.tau2.telecom_db import TODAY, TelecomState

LINE_STATUSES = ["Active", "Suspended", "Pending Activation", "Closed"]
_PREFIX_TABLE = {"L": ("lines", "line_id", "Line"), "D": ("devices", "device_id", "Device"),
                 "B": ("bills", "bill_id", "Bill"), "C": ("customers", "customer_id", "Customer"),
                 "P": ("plans", "plan_id", "Plan")}


def _find(st: TelecomState, table: str, key: str, value: Any, what: str) -> dict:
    for row in st.agent[table]:
        if row[key] == value:
            return row
    raise Rejected(f"{what} {value} not found")


def customer(st: TelecomState, customer_id: str) -> dict:
    return _find(st, "customers", "customer_id", customer_id, "Customer with ID")


def line_by_id(st: TelecomState, line_id: str) -> dict:
    return _find(st, "lines", "line_id", line_id, "Line with ID")


def line_by_phone(st: TelecomState, phone_number: str) -> dict:
    return _find(st, "lines", "phone_number", phone_number, "Line with phone number")


def plan(st: TelecomState, plan_id: str) -> dict:
    return _find(st, "plans", "plan_id", plan_id, "Plan with ID")


def bill(st: TelecomState, bill_id: str) -> dict:
    return _find(st, "bills", "bill_id", bill_id, "Bill with ID")


def customer_by_phone(st: TelecomState, phone_number: str) -> dict:
    """The customer whose contact number or one of whose lines is `phone_number`."""
    for c in st.agent["customers"]:
        if c["phone_number"] == phone_number:
            return c
        if any(line_by_id(st, lid)["phone_number"] == phone_number for lid in c["line_ids"]):
            return c
    raise Rejected(f"Customer with phone number {phone_number} not found")


def bills_awaiting_payment(st: TelecomState, cust: dict) -> list[dict]:
    return [b for b in (bill(st, bid) for bid in cust["bill_ids"]) if b["status"] == "Awaiting Payment"]


def _owned_line(st: TelecomState, customer_id: str, line_id: str) -> dict:
    if line_id not in customer(st, customer_id)["line_ids"]:
        raise Rejected(f"Line {line_id} not found for customer {customer_id}")
    return line_by_id(st, line_id)


def _first_of_next_month(day: datetime.date) -> datetime.date:
    return (day.replace(day=1) + datetime.timedelta(days=32)).replace(day=1)


def _charge(st: TelecomState, customer_id: str, amount: float, description: str) -> None:
    """Add a line item to the customer's first draft bill, opening next month's if none."""
    cust = customer(st, customer_id)
    draft = next((b for b in (bill(st, bid) for bid in cust["bill_ids"]) if b["status"] == "Draft"),
                 None)
    if draft is None:
        start = _first_of_next_month(TODAY)
        st.new_bill_ids += 1
        draft = {"bill_id": f"BNEW{st.new_bill_ids}", "customer_id": customer_id,
                 "period_start": start.isoformat(),
                 "period_end": (_first_of_next_month(start) - datetime.timedelta(days=1)).isoformat(),
                 "issue_date": start.isoformat(), "total_due": 0.0,
                 "due_date": (start + datetime.timedelta(days=14)).isoformat(),
                 "line_items": [], "status": "Draft"}
        st.agent["bills"].append(draft)
        cust["bill_ids"].append(draft["bill_id"])
    draft["line_items"].append({"description": description, "amount": amount,
                                "date": TODAY.isoformat(),
                                "item_type": "Credit" if amount < 0 else "Charge"})
    draft["total_due"] += amount


# ---- tools ------------------------------------------------------------------------------------

def get_customer_by_phone(st: TelecomState, a: dict) -> dict:
    return customer_by_phone(st, a["phone_number"])


def get_customer_by_id(st: TelecomState, a: dict) -> dict:
    return customer(st, a["customer_id"])


def get_customer_by_name(st: TelecomState, a: dict) -> list[dict]:
    return [c for c in st.agent["customers"]
            if c["full_name"].lower() == a["full_name"].lower() and c["date_of_birth"] == a["dob"]]


def get_details_by_id(st: TelecomState, a: dict) -> dict:
    ident = a["id"]
    if not ident or ident[0] not in _PREFIX_TABLE:
        raise Rejected(f"Unknown ID format or type: {ident} (ids start with one of "
                       f"{sorted(_PREFIX_TABLE)})")
    table, key, what = _PREFIX_TABLE[ident[0]]
    return _find(st, table, key, ident, f"{what} with ID")


def suspend_line(st: TelecomState, a: dict) -> dict:
    line = _owned_line(st, a["customer_id"], a["line_id"])
    if line["status"] != "Active":
        raise Rejected("Line must be active to suspend")
    line["status"], line["suspension_start_date"] = "Suspended", TODAY.isoformat()
    return {"message": "Line suspended successfully. $5/month holding fee will apply.", "line": line}


def resume_line(st: TelecomState, a: dict) -> dict:
    line = _owned_line(st, a["customer_id"], a["line_id"])
    if line["status"] not in ("Suspended", "Pending Activation"):
        raise Rejected("Line must be suspended to resume")
    line["status"], line["suspension_start_date"] = "Active", None
    return {"message": "Line resumed successfully", "line": line}


def get_bills_for_customer(st: TelecomState, a: dict) -> list[dict]:
    bills = [bill(st, bid) for bid in customer(st, a["customer_id"])["bill_ids"]]
    # ISO dates sort as dates; a stable sort keeps the customer's order among equal dates
    return sorted(bills, key=lambda b: b["issue_date"], reverse=True)[:a.get("limit", 12)]


def send_payment_request(st: TelecomState, a: dict) -> str:
    cust = customer(st, a["customer_id"])
    if bills_awaiting_payment(st, cust):
        raise Rejected("A bill is already awaiting payment for this customer")
    if a["bill_id"] not in cust["bill_ids"]:
        raise Rejected(f"Bill {a['bill_id']} not found for customer {a['customer_id']}")
    bill(st, a["bill_id"])["status"] = "Awaiting Payment"
    return f"Payment request sent to the customer for bill {a['bill_id']}"


def get_data_usage(st: TelecomState, a: dict) -> dict:
    line = _owned_line(st, a["customer_id"], a["line_id"])
    return {"line_id": a["line_id"], "data_used_gb": line["data_used_gb"],
            "data_limit_gb": plan(st, line["plan_id"])["data_limit_gb"],
            "data_refueling_gb": line["data_refueling_gb"],
            "cycle_end_date": (_first_of_next_month(TODAY) - datetime.timedelta(days=1)).isoformat()}


def enable_roaming(st: TelecomState, a: dict) -> str:
    line = _owned_line(st, a["customer_id"], a["line_id"])
    if line["roaming_enabled"]:
        return "Roaming was already enabled"
    line["roaming_enabled"] = True
    return "Roaming enabled successfully"


def disable_roaming(st: TelecomState, a: dict) -> str:
    line = _owned_line(st, a["customer_id"], a["line_id"])
    if not line["roaming_enabled"]:
        return "Roaming was already disabled"
    line["roaming_enabled"] = False
    return "Roaming disabled successfully"


def transfer_to_human_agents(st: TelecomState, a: dict) -> str:
    return "Transfer successful"


def refuel_data(st: TelecomState, a: dict) -> dict:
    line = _owned_line(st, a["customer_id"], a["line_id"])
    gb = a["gb_amount"]
    if gb <= 0:
        raise Rejected(f"gb_amount={gb}: refuel amount must be positive")
    price = plan(st, line["plan_id"])["data_refueling_price_per_gb"]
    charge = gb * price
    line["data_refueling_gb"] += gb
    # the description formats the numbers as Python does (2.0, not 2), like the benchmark's bill
    _charge(st, a["customer_id"], charge, f"Data refueling: {gb} GB at ${price}/GB")
    return {"message": f"Successfully added {gb} GB of data for line {a['line_id']} for ${charge:.2f}",
            "new_data_refueling_gb": line["data_refueling_gb"], "charge": charge}


# ---- setup functions and assertions (not offered to the model) ---------------------------------

def set_data_usage(st: TelecomState, a: dict) -> str:
    _owned_line(st, a["customer_id"], a["line_id"])["data_used_gb"] = a["data_used_gb"]
    return f"Data usage set to {a['data_used_gb']} GB for line {a['line_id']}"


def suspend_line_for_overdue_bill(st: TelecomState, a: dict) -> str:
    """Bill last month's plan price as a new overdue bill `new_bill_id` and suspend the line."""
    line = line_by_id(st, a["line_id"])
    if line["status"] != "Active":
        raise Rejected("Line must be active to suspend for unpaid bill")
    amount = plan(st, line["plan_id"])["price_per_month"]
    if amount <= 0:
        raise Rejected("Amount must be positive for overdue bill")
    cust = customer(st, a["customer_id"])
    if any(bill(st, bid)["status"] == "Overdue" for bid in cust["bill_ids"]):
        raise Rejected("Customer already has an overdue bill")
    last_month_end = TODAY.replace(day=1) - datetime.timedelta(days=1)
    last_month_start = last_month_end.replace(day=1)
    st.agent["bills"].append({
        "bill_id": a["new_bill_id"], "customer_id": a["customer_id"],
        "period_start": last_month_start.isoformat(), "period_end": last_month_end.isoformat(),
        "issue_date": last_month_start.isoformat(), "total_due": 0.0 + amount,
        "due_date": (last_month_start + datetime.timedelta(days=14)).isoformat(),
        "line_items": [{"description": f"Charge for line {line['line_id']}", "amount": amount,
                        "date": TODAY.isoformat(), "item_type": "Charge"}],
        "status": "Overdue"})
    cust["bill_ids"].append(a["new_bill_id"])
    line["status"], line["suspension_start_date"] = "Suspended", TODAY.isoformat()
    if a["contract_ended"]:
        line["contract_end_date"] = last_month_end.isoformat()
    return (f"Line {a['line_id']} suspended for unpaid bill {a['new_bill_id']}. "
            f"Contract ended: {a['contract_ended']}")


def assert_data_refueling_amount(st: TelecomState, a: dict) -> bool:
    line = _owned_line(st, a["customer_id"], a["line_id"])
    return abs(line["data_refueling_gb"] - a["expected_amount"]) < 1e-6


def assert_line_status(st: TelecomState, a: dict) -> bool:
    return _owned_line(st, a["customer_id"], a["line_id"])["status"] == a["expected_status"]


def assert_overdue_bill_exists(st: TelecomState, a: dict) -> bool:
    if a["overdue_bill_id"] not in customer(st, a["customer_id"])["bill_ids"]:
        raise Rejected(f"Overdue bill {a['overdue_bill_id']} not found")
    if bill(st, a["overdue_bill_id"])["status"] != "Overdue":
        raise Rejected(f"Overdue bill {a['overdue_bill_id']} is not overdue")
    return True


def assert_no_overdue_bill(st: TelecomState, a: dict) -> bool:
    """True when the bill is paid or does not exist."""
    try:
        return bill(st, a["overdue_bill_id"])["status"] == "Paid"
    except Rejected:
        return True


_CID = s("The customer's ID, e.g. C1001")
_LID = s("The line's ID, e.g. L1001")
_NUM = {"type": "number"}


FUNCTIONS: tuple[DomainFunction, ...] = (
    _f(get_customer_by_phone, "read", "Find a customer by their primary contact number or the "
       "number of one of their lines.", obj({"phone_number": s("Phone number, e.g. 555-123-2002")})),
    _f(get_customer_by_id, "read", "Get a customer's record by ID.", obj({"customer_id": _CID})),
    _f(get_customer_by_name, "read", "Customers whose full name (any case) and date of birth "
       "match; a list, possibly empty.",
       obj({"full_name": s("Full name"), "dob": s("Date of birth, YYYY-MM-DD")})),
    _f(get_details_by_id, "read", "The record for any ID: L... line, D... device, B... bill, "
       "C... customer, P... plan.", obj({"id": s("The ID, e.g. L1001 or P1002")})),
    _f(suspend_line, "write", "Suspend an active line (a $5/month holding fee applies).",
       obj({"customer_id": _CID, "line_id": _LID, "reason": s("Why the line is suspended")})),
    _f(resume_line, "write", "Reactivate a suspended or pending line.",
       obj({"customer_id": _CID, "line_id": _LID})),
    _f(get_bills_for_customer, "read", "A customer's bills, newest issue date first.",
       obj({"customer_id": _CID, "limit": i("At most this many bills (default 12)")},
           ["customer_id"])),
    _f(send_payment_request, "write", "Ask the customer to pay a bill; they see the request on "
       "their phone. Refused while another bill awaits payment.",
       obj({"customer_id": _CID, "bill_id": s("The bill's ID, e.g. B1001")})),
    _f(get_data_usage, "read", "A line's data used and refueled this cycle, its plan's limit and "
       "the cycle's end date.", obj({"customer_id": _CID, "line_id": _LID})),
    _f(enable_roaming, "write", "Allow international roaming on a line.",
       obj({"customer_id": _CID, "line_id": _LID})),
    _f(disable_roaming, "write", "Stop international roaming on a line.",
       obj({"customer_id": _CID, "line_id": _LID})),
    _f(transfer_to_human_agents, "generic", "Hand the conversation to a human agent, with a "
       "summary of the problem.", obj({"summary": s("What the user needs and what was tried")})),
    _f(refuel_data, "write", "Add data to a line for this cycle, charged at the plan's price per "
       "GB on the customer's draft bill.",
       obj({"customer_id": _CID, "line_id": _LID,
            "gb_amount": {"type": "number", "description": "GB to add, > 0"}})),
    _f(set_data_usage, "env", "Set a line's data used this cycle.",
       obj({"customer_id": _CID, "line_id": _LID, "data_used_gb": _NUM})),
    _f(suspend_line_for_overdue_bill, "env", "Open an overdue bill and suspend the line.",
       obj({"customer_id": _CID, "line_id": _LID, "new_bill_id": s("Bill ID"),
            "contract_ended": {"type": "boolean"}})),
    _f(assert_data_refueling_amount, "assert", "", obj({"customer_id": _CID, "line_id": _LID,
                                                        "expected_amount": _NUM})),
    _f(assert_line_status, "assert", "", obj({"customer_id": _CID, "line_id": _LID,
                                              "expected_status": s("", LINE_STATUSES)})),
    _f(assert_overdue_bill_exists, "assert", "", obj({"customer_id": _CID,
                                                      "overdue_bill_id": s("")})),
    _f(assert_no_overdue_bill, "assert", "", obj({"overdue_bill_id": s("")})),
)
