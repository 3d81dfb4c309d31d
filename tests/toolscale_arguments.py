"""Argument sets, derived from a released ToolScale domain's shipped db.json, for the tools whose
preconditions tie several arguments together (a game in progress and one of its clubs, a
payment method of the prescription's patient), which `synth.exercise`'s generic sampler does
not build; and the tools no argument set can make succeed on the shipped DB, each with the
DB fact that says why (asserted by the test, not assumed).

A derivation may leave a payment amount to the domain's own quote: `QUOTE` reads the total
from its "does not add up" error, and the call is made once more with that amount, as an
agent would after asking for the price.
"""

from __future__ import annotations

import re
from typing import Any, Callable

QUOTE = re.compile(r"total (?:price|due) is (-?[\d.]+)")


def with_quote(args: dict, error: str) -> dict | None:
    """`args` with its payment's amount set to the total the domain quoted in `error` (None:
    no quote in it). The payment is the first dict with an "amount" in a list argument."""
    match = QUOTE.search(error)
    if match is None:
        return None
    for name, value in args.items():
        if isinstance(value, list) and value and isinstance(value[0], dict) \
                and "amount" in value[0]:
            return {**args, name: [{**value[0], "amount": float(match.group(1))}, *value[1:]]}
    return None


def _first(rows, ok: Callable[[Any], bool]):
    return next(r for r in rows if ok(r))


# ------------------------------------------------------------------------------- basketball

def _record_scoring_event(db):
    game = _first(db["games"].values(), lambda g: g["status"] == "in_progress")
    club = game["clubs"]["home"]["club_id"]
    player = _first(db["players"].values(), lambda p: True)
    return {"game_id": game["game_id"], "event_type": "2PT", "points": 2, "club_id": club,
            "player_id": player["player_id"], "timestamp": "Q2 03:21"}


# -------------------------------------------------------------------------------- ecommerce

def _exchange_delivered_sale_lines(db):
    def swap(sale):  # an in-stock offering of the line's catalogue group (every delivered
        line = sale["lines"][0]  # line's group has just the one it was sold as)
        group = db["catalogue"][line["catalog_ref"]]["offerings"]
        return next((sku for sku, o in group.items() if o["in_stock"]), None)

    sale = _first(db["sales"].values(), lambda s: s["state"] == "delivered" and swap(s))
    instrument = next(iter(db["accounts"][sale["account_key"]]["funding_sources"]))
    return {"sale_ref": sale["sale_ref"], "unit_skus_old": [sale["lines"][0]["unit_sku"]],
            "unit_skus_new": [swap(sale)], "instrument_id": instrument}


# --------------------------------------------------------------------------------- medicine

def _medicine_method(patient):
    return next(iter(patient["payment_methods"]))


def _add_patient_payment_method(db):
    patient = next(iter(db["patients"].values()))
    template = patient["payment_methods"][_medicine_method(patient)]
    return {"patient_id": patient["patient_id"],
            "payment_method": {**template, "payment_method_id": "PM-NEW-1"}}


def _add_prescription_payment(db):
    rx = next(iter(db["prescriptions"].values()))
    method = _medicine_method(db["patients"][rx["patient_id"]])
    return {"prescription_id": rx["prescription_id"],
            "payment": {"payment_id": method, "amount": 10.0}}


def _fill_prescription(db):
    rx = next(iter(db["prescriptions"].values()))
    order = rx["medication_orders"][0]
    lot = next(iter(db["medications"][order["medication_id"]]["batches"]))
    price = 100.0
    # insurance billed the full price with a copay of 20: the patient pays 20
    return {"prescription_id": rx["prescription_id"], "pharmacist_id": "RPH-1001",
            "items": [{"medication_id": order["medication_id"], "quantity_dispensed": 1,
                       "lot_number": lot, "expiration_date": "27-01-01", "price": price}],
            "insurance": {"billed_amount": price, "insurance_paid": price - 20.0,
                          "patient_copay": 20.0, "reversals": []},
            "payments": [{"payment_id": _medicine_method(db["patients"][rx["patient_id"]]),
                          "amount": 20.0}]}


# ------------------------------------------------------------------------------------ movie

def _create_booking(db):
    booked = {(b["theater_id"], b["show_id"], s["seat_id"]) for b in db["bookings"].values()
              if b["status"] != "canceled" for s in b["seats"]}
    for theater in db["theaters"].values():
        for day in theater["dates"].values():
            for show in day["shows"]:
                if show["status"] != "scheduled":
                    continue
                rows = theater["auditoriums"][show["auditorium_id"]]["seat_map"]["rows"]
                free = [s["seat_id"] for row in rows.values() for s in row
                        if (theater["theater_id"], show["show_id"], s["seat_id"]) not in booked]
                if free:
                    customer = next(iter(db["bookings"].values()))["customer"]
                    return {"theater_id": theater["theater_id"], "show_id": show["show_id"],
                            "customer": customer,
                            "seats": [{"seat_id": free[0], "ticket_type": "adult"}],
                            "delivery_method": "e-ticket",
                            "payments": [{**next(iter(db["bookings"].values()))
                                          ["payment_history"][0], "amount": 0.0}]}
    raise AssertionError("no free seat on a scheduled show")


# ---------------------------------------------------------------------------------- railway

def _running_train(db):
    return _first(db["trains"].values(), lambda t: any(
        d["status"] != "cancelled" for d in t["dates"].values()))


def _running_date(train):
    return next(k for k, d in train["dates"].items() if d["status"] != "cancelled")


def _card(user):
    return next(k for k, m in user["payment_methods"].items() if m["source"] != "wallet")


def _book_train_reservation(db):
    train = _running_train(db)
    user = _first(db["users"].values(), lambda u: any(
        m["source"] != "wallet" for m in u["payment_methods"].values()))
    return {"user_id": user["user_id"], "origin": train["origin"],
            "destination": train["destination"], "trip_type": "one_way",
            "travel_class": "sleeper",
            "trains": [{"train_number": train["train_number"], "date": _running_date(train)}],
            "passengers": [{k: user["name"][k] for k in ("first_name", "last_name")}
                           | {"dob": user["dob"]}],
            "payment_methods": [{"payment_id": _card(user), "amount": 0}],
            "total_bags": 1, "bikes": 0, "meal_preference": "none", "insurance": "no"}


def _update_reservation_trains(db):
    res = _first(db["reservations"].values(), lambda r: r["status"] != "cancelled" and any(
        m["source"] != "wallet" for m in db["users"][r["user_id"]]["payment_methods"].values()))
    train = _running_train(db)
    return {"reservation_id": res["reservation_id"], "travel_class": "sleeper",
            "trains": [{"train_number": train["train_number"], "date": _running_date(train)}],
            "payment_id": _card(db["users"][res["user_id"]])}


# ----------------------------------------------------------------------------------- school

def _open_course(db, term=None):
    return _first(db["courses"].values(), lambda c: c["current_enrollment"] < c["capacity"]
                  and (term is None or c["term"] == term))


def _register_courses(db):
    student = next(iter(db["students"].values()))
    course = _open_course(db)
    return {"student_id": student["student_id"], "term": course["term"],
            "course_ids": [course["course_id"]], "study_level": "undergraduate",
            "grading_options": {course["course_id"]: "letter"}, "health_insurance": "no",
            "payment_methods": [{"payment_id": next(iter(student["payment_methods"])),
                                 "amount": 0}]}


def _update_registration_courses(db):
    reg = next(iter(db["registrations"].values()))
    student = db["students"][reg["student_id"]]
    return {"registration_id": reg["registration_id"], "add_course_ids": [],
            "drop_course_ids": [reg["courses"][0]["course_id"]],
            "payment_id": next(iter(student["payment_methods"]))}


def _pay_registration(db):
    reg = next(iter(db["registrations"].values()))
    student = db["students"][reg["student_id"]]
    return {"registration_id": reg["registration_id"],
            "payment": {"payment_id": next(iter(student["payment_methods"])), "amount": 100}}


# ----------------------------------------------------------------------------------- travel

def _book_package(db):
    package = _first(db["packages"].values(), lambda p: p.get("managed_by_agents") and any(
        d["status"] == "available" and d["available_slots"] >= 1
        for d in p["departures"].values()))
    date = next(k for k, d in package["departures"].items()
                if d["status"] == "available" and d["available_slots"] >= 1)
    traveler = next(iter(db["travelers"].values()))
    return {"traveler_id": traveler["traveler_id"], "package_id": package["package_id"],
            "departure_date": date,
            "travelers": [{**traveler["name"], "dob": traveler["dob"]}],
            "rooming": {"room_type": "single", "occupancy": 1}, "add_ons": [],
            "insurance": None,
            "payment_methods": [{"payment_id": next(iter(traveler["payment_methods"])),
                                 "amount": 0}]}


def _schedule_agent_meeting(db):
    agent = _first(db["agents"].values(), lambda a: any(
        d["slots"] for d in a["availability"].values()))
    date = next(k for k, d in agent["availability"].items() if d["slots"])
    return {"agent_id": agent["agent_id"], "date": date,
            "time_range": agent["availability"][date]["slots"][0],
            "traveler_id": next(iter(db["travelers"]))}


DERIVED: dict[tuple[str, str], Callable[[dict], dict]] = {
    ("basketball", "record_scoring_event"): _record_scoring_event,
    ("ecommerce", "exchange_delivered_sale_lines"): _exchange_delivered_sale_lines,
    ("medicine", "add_patient_payment_method"): _add_patient_payment_method,
    ("medicine", "add_prescription_payment"): _add_prescription_payment,
    ("medicine", "fill_prescription"): _fill_prescription,
    ("movie", "create_booking"): _create_booking,
    ("railway", "book_train_reservation"): _book_train_reservation,
    ("railway", "update_reservation_trains"): _update_reservation_trains,
    ("school", "register_courses"): _register_courses,
    ("school", "update_registration_courses"): _update_registration_courses,
    ("school", "pay_registration"): _pay_registration,
    ("travel", "book_package"): _book_package,
    ("travel", "schedule_agent_meeting"): _schedule_agent_meeting,
}


# ------------------------------------------------------- what the shipped DBs cannot satisfy

def _no_pending_sale(db):
    return not any("pending" in s["state"].lower() for s in db["sales"].values())


def _any_sale(db):
    return next(iter(db["sales"]))


def _no_other_instrument(db):
    """No placed ticket's patron holds an instrument other than the one the ticket is paid
    with."""
    return all(set(db["patron_registry"][t["guest_ref"]]["saved_instruments"])
               <= {c["instrument_ref"] for c in t["charges"] if c["kind"] == "payment"}
               for t in db["service_tickets"].values() if t["state"] == "placed")


def _placed_ticket(db):
    ticket = _first(db["service_tickets"].values(), lambda t: t["state"] == "placed")
    return {"ticket_ref": ticket["ticket_ref"],
            "instrument_ref": next(iter(db["patron_registry"][ticket["guest_ref"]]
                                        ["saved_instruments"]))}


_ADDRESS = {"line1": "1 Main St", "line2": "", "municipality": "Springfield", "region": "IL",
            "nation": "USA", "postal_code": "62704"}

# (domain, tool) -> (why, the DB fact behind it, arguments to try, the error the domain gives)
CANNOT: dict[tuple[str, str], tuple[str, Callable, Callable, str]] = {
    ("ecommerce", "cancel_pending_sale"): (
        "no sale is pending", _no_pending_sale,
        lambda db: {"sale_ref": _any_sale(db), "reason": "no longer needed"},
        "Non-pending sale cannot be cancelled"),
    ("ecommerce", "modify_pending_sale_delivery"): (
        "no sale is pending", _no_pending_sale,
        lambda db: {"sale_ref": _any_sale(db), **_ADDRESS},
        "Non-pending sale cannot be modified"),
    ("ecommerce", "modify_pending_sale_payment"): (
        "no sale is pending", _no_pending_sale,
        lambda db: {"sale_ref": _any_sale(db),
                    "instrument_id": next(iter(db["accounts"][db["sales"][_any_sale(db)]
                                                   ["account_key"]]["funding_sources"]))},
        "Non-pending sale cannot be modified"),
    ("restaurant", "modify_placed_ticket_instrument"): (
        "no placed ticket's patron has an instrument but the one it is paid with",
        _no_other_instrument, _placed_ticket,
        "The new instrument should be different from the current one"),
}
