"""Airline domain functions (tau2-bench semantics, our code).

DB: {"flights": {flight_number: {..., dates: {YYYY-MM-DD: {status, available_seats?, prices?}}}},
"users": {user_id: {..., payment_methods: {id: {source, id, amount?}}, reservations}},
"reservations": {reservation_id: {..., flights, passengers, payment_history, status}}}.
Prices are integer dollars. "Today" is 2024-05-15 15:00 EST, fixed by the benchmark.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

from orchestrax.envs.tau2.db import DomainDB, Rejected
from orchestrax.envs.tau2.functions import (CALCULATE, CONFIRM, TRANSFER_TO_HUMAN_AGENTS,
                                           DomainFunction, arr, i, obj, s)

NOW = "2024-05-15T15:00:00"
_NEW_RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")
_NEW_CERTIFICATE_IDS = ("certificate_3221322", "certificate_3221323", "certificate_3221324")
CABINS = ["basic_economy", "economy", "business"]
_AIRPORTS = (("SFO", "San Francisco"), ("JFK", "New York"), ("LAX", "Los Angeles"),
             ("ORD", "Chicago"), ("DFW", "Dallas"), ("DEN", "Denver"), ("SEA", "Seattle"),
             ("ATL", "Atlanta"), ("MIA", "Miami"), ("BOS", "Boston"), ("PHX", "Phoenix"),
             ("IAH", "Houston"), ("LAS", "Las Vegas"), ("MCO", "Orlando"), ("EWR", "Newark"),
             ("CLT", "Charlotte"), ("MSP", "Minneapolis"), ("DTW", "Detroit"),
             ("PHL", "Philadelphia"), ("LGA", "LaGuardia"))


def normalise(db: dict[str, Any]) -> dict[str, Any]:
    """Explicit `status: None` on live reservations, as the benchmark's typed DB dumps them."""
    for res in db["reservations"].values():
        res.setdefault("status", None)
    for user in db["users"].values():
        user["address"].setdefault("address2", None)
    return db


def _flight_date(db: DomainDB, flight_number: str, date: str) -> tuple[dict, dict]:
    flight = db.get("flights", flight_number, "Flight")
    if date not in flight["dates"]:
        raise Rejected(f"Flight {flight_number} not found on date {date}")
    return flight, flight["dates"][date]


def _bookable(db: DomainDB, flight_number: str, date: str, cabin: str, seats: int) -> tuple[dict, dict]:
    flight, day = _flight_date(db, flight_number, date)
    if day["status"] != "available":
        raise Rejected(f"Flight {flight_number} not available on date {date}")
    if day["available_seats"][cabin] < seats:
        raise Rejected(f"Not enough seats on flight {flight_number}")
    return flight, day


def _check_update_payment(user: dict, payment_id: str, total: int) -> dict:
    if payment_id not in user["payment_methods"]:
        raise Rejected(f"Payment method {payment_id} not found")
    method = user["payment_methods"][payment_id]
    if method["source"] == "certificate":
        raise Rejected("Certificate cannot be used to update reservation")
    if method["source"] == "gift_card" and method["amount"] < total:
        raise Rejected("Gift card balance is not enough")
    return method


def _pay_update(db: DomainDB, user_id: str, payment_id: str, total: int, res: dict) -> None:
    """Charge (total > 0) or refund (total < 0) an update; gift cards move at once."""
    method = db.mut("users", user_id, "User")["payment_methods"][payment_id]
    if method["source"] == "gift_card":
        method["amount"] -= total
    if total != 0:
        res["payment_history"].append({"payment_id": payment_id, "amount": total})


def book_reservation(db: DomainDB, a: dict) -> dict:
    user = db.get("users", a["user_id"], "User")
    rid = next((r for r in _NEW_RESERVATION_IDS if not db.has("reservations", r)), None)
    if rid is None:
        raise Rejected("Too many reservations")
    cabin, n = a["cabin"], len(a["passengers"])
    legs, days, total = [], [], 0
    for f in a["flights"]:
        flight, day = _bookable(db, f["flight_number"], f["date"], cabin, n)
        price = day["prices"][cabin]
        legs.append({"flight_number": f["flight_number"], "origin": flight["origin"],
                     "destination": flight["destination"], "date": f["date"], "price": price})
        days.append((f["flight_number"], f["date"]))
        total += price * n
    if a["insurance"] == "yes":
        total += 30 * n
    total += 50 * a["nonfree_baggages"]
    for p in a["payment_methods"]:
        if p["payment_id"] not in user["payment_methods"]:
            raise Rejected(f"Payment method {p['payment_id']} not found")
        method = user["payment_methods"][p["payment_id"]]
        if method["source"] in ("gift_card", "certificate") and method["amount"] < p["amount"]:
            raise Rejected(f"Not enough balance in payment method {p['payment_id']}")
    paid = sum(p["amount"] for p in a["payment_methods"])
    if paid != total:
        raise Rejected(f"Payment amount does not add up, total price is {total}, but paid {paid}")
    user = db.mut("users", a["user_id"], "User")
    for p in a["payment_methods"]:
        method = user["payment_methods"].get(p["payment_id"])
        if method is None:
            continue  # a certificate listed twice was already used up
        if method["source"] == "gift_card":
            method["amount"] -= p["amount"]
        elif method["source"] == "certificate":
            del user["payment_methods"][p["payment_id"]]
    for number, date in days:
        db.mut("flights", number, "Flight")["dates"][date]["available_seats"][cabin] -= n
    res = {"reservation_id": rid, "user_id": a["user_id"], "origin": a["origin"],
           "destination": a["destination"], "flight_type": a["flight_type"], "cabin": cabin,
           "flights": legs,
           "passengers": [{k: p[k] for k in ("first_name", "last_name", "dob")} for p in a["passengers"]],
           "payment_history": [{"payment_id": p["payment_id"], "amount": p["amount"]}
                               for p in a["payment_methods"]],
           "created_at": NOW, "total_baggages": a["total_baggages"],
           "nonfree_baggages": a["nonfree_baggages"], "insurance": a["insurance"], "status": None}
    db.insert("reservations", rid, res)
    user["reservations"].append(rid)
    return res


def cancel_reservation(db: DomainDB, a: dict) -> dict:
    res = db.mut("reservations", a["reservation_id"], "Reservation")
    # Like the benchmark: refunds are recorded, seats are not released.
    res["payment_history"].extend([{"payment_id": p["payment_id"], "amount": -p["amount"]}
                                   for p in list(res["payment_history"])])
    res["status"] = "cancelled"
    return res


def update_reservation_baggages(db: DomainDB, a: dict) -> dict:
    res = db.get("reservations", a["reservation_id"], "Reservation")
    user = db.get("users", res["user_id"], "User")
    total = 50 * max(0, a["nonfree_baggages"] - res["nonfree_baggages"])
    _check_update_payment(user, a["payment_id"], total)
    res = db.mut("reservations", a["reservation_id"], "Reservation")
    _pay_update(db, res["user_id"], a["payment_id"], total, res)
    res["total_baggages"] = a["total_baggages"]
    res["nonfree_baggages"] = a["nonfree_baggages"]
    return res


def update_reservation_flights(db: DomainDB, a: dict) -> dict:
    res = db.get("reservations", a["reservation_id"], "Reservation")
    user = db.get("users", res["user_id"], "User")
    cabin, n = a["cabin"], len(res["passengers"])
    legs, total = [], 0
    for f in a["flights"]:
        kept = next((leg for leg in res["flights"] if leg["flight_number"] == f["flight_number"]
                     and leg["date"] == f["date"] and cabin == res["cabin"]), None)
        if kept is None:  # a new leg (or a cabin change) is priced at today's fare
            flight, day = _bookable(db, f["flight_number"], f["date"], cabin, n)
            kept = {"flight_number": f["flight_number"], "date": f["date"],
                    "price": day["prices"][cabin], "origin": flight["origin"],
                    "destination": flight["destination"]}
        legs.append(copy.deepcopy(kept))
        total += kept["price"] * n
    total -= sum(leg["price"] for leg in res["flights"]) * n
    _check_update_payment(user, a["payment_id"], total)
    res = db.mut("reservations", a["reservation_id"], "Reservation")
    _pay_update(db, res["user_id"], a["payment_id"], total, res)
    res["flights"] = legs
    res["cabin"] = cabin  # like the benchmark, seat inventory is not updated here
    return res


def update_reservation_passengers(db: DomainDB, a: dict) -> dict:
    res = db.get("reservations", a["reservation_id"], "Reservation")
    if len(a["passengers"]) != len(res["passengers"]):
        raise Rejected("Number of passengers does not match")
    res = db.mut("reservations", a["reservation_id"], "Reservation")
    res["passengers"] = [{k: p[k] for k in ("first_name", "last_name", "dob")} for p in a["passengers"]]
    return res


def send_certificate(db: DomainDB, a: dict) -> str:
    user = db.get("users", a["user_id"], "User")
    cid = next((c for c in _NEW_CERTIFICATE_IDS if c not in user["payment_methods"]), None)
    if cid is None:
        raise Rejected("Too many certificates")
    user = db.mut("users", a["user_id"], "User")
    # float: the benchmark stores certificate amounts as floats (100 -> 100.0 in its dumps)
    user["payment_methods"][cid] = {"id": cid, "amount": float(a["amount"]), "source": "certificate"}
    return f"Certificate {cid} added to user {a['user_id']} with amount {a['amount']}."


def _direct(db: DomainDB, date: str, origin: str | None, destination: str | None,
            leave_after: str | None = None) -> list[dict]:
    out = []
    for flight in db.tables["flights"].values():
        day = flight["dates"].get(date)
        if (day is not None and day["status"] == "available"
                and (origin is None or flight["origin"] == origin)
                and (destination is None or flight["destination"] == destination)
                and (leave_after is None or flight["scheduled_departure_time_est"] >= leave_after)):
            out.append({k: flight[k] for k in ("flight_number", "origin", "destination",
                                                "scheduled_departure_time_est",
                                                "scheduled_arrival_time_est")}
                       | {"status": "available", "date": None,
                          "available_seats": day["available_seats"], "prices": day["prices"]})
    return out


def search_onestop_flight(db: DomainDB, a: dict) -> list[list[dict]]:
    out = []
    for first in _direct(db, a["date"], a["origin"], None):
        first["date"] = a["date"]
        date2 = a["date"]
        if "+1" in first["scheduled_arrival_time_est"]:
            # The benchmark builds "2024-05-{day+1}" without zero padding; we use real dates.
            date2 = (datetime.date.fromisoformat(a["date"]) + datetime.timedelta(days=1)).isoformat()
        for second in _direct(db, date2, first["destination"], a["destination"],
                              leave_after=first["scheduled_arrival_time_est"]):
            second["date"] = date2
            out.append([first, second])
    return out


def _date_ok(date: str) -> str:
    try:
        datetime.date.fromisoformat(date)
    except ValueError:
        raise Rejected(f"date={date!r}; expected YYYY-MM-DD") from None
    return date


_RES_ID = s("The reservation id, such as 'ZFA04Y'.")
_USER_ID = s("The user id, such as 'sara_doe_496'.")
_DATE = s("Date as YYYY-MM-DD, such as '2024-05-01'.")
_IATA = "Airport IATA code, such as 'JFK'."
_FLIGHTS = arr(obj({"flight_number": s("Such as 'HAT001'."), "date": _DATE}), "Flight legs.")
_PASSENGERS = arr(obj({"first_name": s("First name."), "last_name": s("Last name."),
                       "dob": s("Date of birth, YYYY-MM-DD.")}), "Passengers.")
_PAY_ID = s("A payment id from the user's profile, such as 'credit_card_7815826' or "
            "'gift_card_7815826'.")

FUNCTIONS: tuple[DomainFunction, ...] = (
    DomainFunction(name="book_reservation", kind="write", fn=book_reservation,
                   description="Book a reservation; payments must add up to the fare times passengers, "
                               "plus $30 per passenger for insurance and $50 per non-free bag." + CONFIRM,
                   parameters=obj({
                       "user_id": _USER_ID, "origin": s(_IATA), "destination": s(_IATA),
                       "flight_type": s("Trip type.", ["one_way", "round_trip"]),
                       "cabin": s("Cabin class.", CABINS), "flights": _FLIGHTS, "passengers": _PASSENGERS,
                       "payment_methods": arr(obj({"payment_id": _PAY_ID, "amount": i("Dollars.")}),
                                              "Payments; at most one certificate, credit card and "
                                              "three gift cards."),
                       "total_baggages": i("Total bags."), "nonfree_baggages": i("Paid bags."),
                       "insurance": s("Travel insurance.", ["yes", "no"])})),
    CALCULATE,
    DomainFunction(name="cancel_reservation", kind="write", fn=cancel_reservation,
                   description="Cancel a whole reservation and refund its payments." + CONFIRM,
                   parameters=obj({"reservation_id": _RES_ID})),
    DomainFunction(name="get_flight_status", kind="read",
                   fn=lambda db, a: _flight_date(db, a["flight_number"], a["date"])[1]["status"],
                   description="Status of a flight on a date.",
                   parameters=obj({"flight_number": s("Such as 'HAT001'."), "date": _DATE})),
    DomainFunction(name="get_reservation_details", kind="read",
                   fn=lambda db, a: db.get("reservations", a["reservation_id"], "Reservation"),
                   description="Details of a reservation.", parameters=obj({"reservation_id": _RES_ID})),
    DomainFunction(name="get_user_details", kind="read",
                   fn=lambda db, a: db.get("users", a["user_id"], "User"),
                   description="Details of a user, including payment methods and reservations.",
                   parameters=obj({"user_id": _USER_ID})),
    DomainFunction(name="list_all_airports", kind="read",
                   fn=lambda db, a: [{"iata": c, "city": city} for c, city in _AIRPORTS],
                   description="All airports served, with IATA codes and cities.", parameters=obj({})),
    DomainFunction(name="search_direct_flight", kind="read",
                   fn=lambda db, a: _direct(db, _date_ok(a["date"]), a["origin"], a["destination"]),
                   description="Direct flights with seats between two airports on a date.",
                   parameters=obj({"origin": s(_IATA), "destination": s(_IATA), "date": _DATE})),
    DomainFunction(name="search_onestop_flight", kind="read",
                   fn=lambda db, a: search_onestop_flight(db, a | {"date": _date_ok(a["date"])}),
                   description="One-stop connections (pairs of flights) between two airports on a date.",
                   parameters=obj({"origin": s(_IATA), "destination": s(_IATA), "date": _DATE})),
    DomainFunction(name="send_certificate", kind="write", fn=send_certificate,
                   description="Send a travel certificate of some dollar amount to a user, as "
                               "compensation allowed by the policy. Be careful!",
                   parameters=obj({"user_id": _USER_ID, "amount": i("Dollars.")})),
    TRANSFER_TO_HUMAN_AGENTS,
    DomainFunction(name="update_reservation_baggages", kind="write", fn=update_reservation_baggages,
                   description="Set the baggage counts of a reservation; extra non-free bags cost $50 "
                               "each, charged to a credit card or gift card." + CONFIRM,
                   parameters=obj({"reservation_id": _RES_ID, "total_baggages": i("New total bags."),
                                   "nonfree_baggages": i("New paid bags."), "payment_id": _PAY_ID})),
    DomainFunction(name="update_reservation_flights", kind="write", fn=update_reservation_flights,
                   description="Replace the flights (and cabin) of a reservation; list EVERY leg of the "
                               "new itinerary, changed or not. The fare difference is charged or "
                               "refunded to a credit card or gift card." + CONFIRM,
                   parameters=obj({"reservation_id": _RES_ID, "cabin": s("Cabin class.", CABINS),
                                   "flights": _FLIGHTS, "payment_id": _PAY_ID})),
    DomainFunction(name="update_reservation_passengers", kind="write", fn=update_reservation_passengers,
                   description="Replace the passenger details of a reservation (same number of "
                               "passengers)." + CONFIRM,
                   parameters=obj({"reservation_id": _RES_ID, "passengers": _PASSENGERS})),
)
