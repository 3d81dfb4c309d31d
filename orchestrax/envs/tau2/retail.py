"""Retail domain functions (tau2-bench semantics, our code).

DB: {"products": {product_id: {name, product_id, variants: {item_id: {item_id, options,
available, price}}}}, "users": {user_id: {..., payment_methods: {id: {source, id, balance?}},
orders}}, "orders": {order_id: {..., items, status, payment_history, ...}}}. Money is float
dollars; gift-card balances are rounded to cents after every change, as the benchmark does.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Callable

from orchestrax.envs.tau2.db import DomainDB, Rejected
from orchestrax.envs.tau2.functions import (CALCULATE, CONFIRM, TRANSFER_TO_HUMAN_AGENTS,
                                           DomainFunction, arr, obj, s)

_ORDER_OPTIONAL = ("cancel_reason", "exchange_items", "exchange_new_items",
                   "exchange_payment_method_id", "exchange_price_difference", "return_items",
                   "return_payment_method_id")
_CANCEL_REASONS = ["no longer needed", "ordered by mistake"]


def normalise(db: dict[str, Any]) -> dict[str, Any]:
    """Make absent optional order fields explicit (None), as the benchmark's typed DB dumps
    them, so our DB hashes agree with tau2-bench's."""
    for order in db["orders"].values():
        for key in _ORDER_OPTIONAL:
            order.setdefault(key, None)
    return db


def _order(db: DomainDB, order_id: str) -> dict:
    return db.get("orders", order_id, "Order")


def _payment_method(db: DomainDB, user_id: str, pm_id: str) -> dict:
    methods = db.get("users", user_id, "User")["payment_methods"]
    if pm_id not in methods:
        raise Rejected(f"Payment method {pm_id} not found")
    return methods[pm_id]


def _add_to_gift_card(db: DomainDB, user_id: str, pm_id: str, dollars: float) -> None:
    """Gift cards are paid from and refunded to at once (other methods outside the DB); the
    balance is rounded to cents after every change, as the benchmark does."""
    card = db.mut("users", user_id, "User")["payment_methods"][pm_id]
    card["balance"] = round(card["balance"] + dollars, 2)


def _check_counts(order: dict, item_ids: list[str]) -> None:
    present = [it["item_id"] for it in order["items"]]
    for item_id in item_ids:
        if item_ids.count(item_id) > present.count(item_id):
            raise Rejected(f"Item {item_id} not found in order {order['order_id']} (or too many)")


def _price_swaps(db: DomainDB, order: dict, item_ids: list[str], new_item_ids: list[str],
                 *, forbid_same: bool) -> tuple[float, dict]:
    """Sum of (new - old) prices, in the benchmark's summation order, and the last variant."""
    if len(item_ids) != len(new_item_ids):
        raise Rejected("item_ids and new_item_ids must have the same length")
    diff, variant = 0, None
    for old_id, new_id in zip(item_ids, new_item_ids):
        if forbid_same and old_id == new_id:
            raise Rejected(f"New item {new_id} must differ from the old item")
        item = next((it for it in order["items"] if it["item_id"] == old_id), None)
        if item is None:
            raise Rejected(f"Item {old_id} not found")
        product = db.get("products", item["product_id"], "Product")
        variant = product["variants"].get(new_id)
        if variant is None or not variant["available"]:
            raise Rejected(f"New item {new_id} not found or not available")
        diff += variant["price"] - item["price"]
    return diff, variant


def cancel_pending_order(db: DomainDB, a: dict) -> dict:
    order = _order(db, a["order_id"])
    if order["status"] != "pending":
        raise Rejected("Non-pending order cannot be cancelled")
    if a["reason"] not in _CANCEL_REASONS:
        raise Rejected(f"reason={a['reason']!r}; allowed: {_CANCEL_REASONS}")
    methods = [_payment_method(db, order["user_id"], p["payment_method_id"])
               for p in order["payment_history"]]
    order = db.mut("orders", a["order_id"], "Order")
    refunds = []
    for pay, method in zip(list(order["payment_history"]), methods):
        refunds.append({"transaction_type": "refund", "amount": pay["amount"],
                        "payment_method_id": pay["payment_method_id"]})
        if method["source"] == "gift_card":
            _add_to_gift_card(db, order["user_id"], method["id"], pay["amount"])
    order["status"] = "cancelled"
    order["cancel_reason"] = a["reason"]
    order["payment_history"].extend(refunds)
    return order


def exchange_delivered_order_items(db: DomainDB, a: dict) -> dict:
    order = _order(db, a["order_id"])
    if order["status"] != "delivered":
        raise Rejected("Non-delivered order cannot be exchanged")
    _check_counts(order, a["item_ids"])
    diff, _ = _price_swaps(db, order, a["item_ids"], a["new_item_ids"], forbid_same=False)
    diff = round(diff, 2)
    method = _payment_method(db, order["user_id"], a["payment_method_id"])
    if method["source"] == "gift_card" and method["balance"] < diff:
        raise Rejected("Insufficient gift card balance to pay for the price difference")
    order = db.mut("orders", a["order_id"], "Order")
    order["status"] = "exchange requested"
    order["exchange_items"] = sorted(a["item_ids"])
    order["exchange_new_items"] = sorted(a["new_item_ids"])
    order["exchange_payment_method_id"] = a["payment_method_id"]
    order["exchange_price_difference"] = diff
    return order


def _find_user(db: DomainDB, matches: Callable[[dict], bool]) -> str:
    """The first user (in DB order) that `matches`, marked as read."""
    for user_id, user in db.tables["users"].items():
        if matches(user):
            db.mark("users", user_id)
            return user_id
    raise Rejected("User not found")


def find_user_id_by_name_zip(db: DomainDB, a: dict) -> str:
    return _find_user(db, lambda user: (
        user["name"]["first_name"].lower() == a["first_name"].lower()
        and user["name"]["last_name"].lower() == a["last_name"].lower()
        and user["address"]["zip"] == a["zip"]))


def find_user_id_by_email(db: DomainDB, a: dict) -> str:
    return _find_user(db, lambda user: user["email"].lower() == a["email"].lower())


def list_all_product_types(db: DomainDB, a: dict) -> str:
    return json.dumps({p["name"]: p["product_id"] for p in db.tables["products"].values()},
                      sort_keys=True)


def _address(a: dict) -> dict:
    return {k: a[k] for k in ("address1", "address2", "city", "country", "state", "zip")}


def modify_pending_order_address(db: DomainDB, a: dict) -> dict:
    if "pending" not in _order(db, a["order_id"])["status"]:
        raise Rejected("Non-pending order cannot be modified")
    order = db.mut("orders", a["order_id"], "Order")
    order["address"] = _address(a)
    return order


def modify_pending_order_items(db: DomainDB, a: dict) -> dict:
    order = _order(db, a["order_id"])
    if order["status"] != "pending":  # strict: items of a pending order change only once
        raise Rejected("Non-pending order cannot be modified")
    _check_counts(order, a["item_ids"])
    diff, variant = _price_swaps(db, order, a["item_ids"], a["new_item_ids"], forbid_same=True)
    method = _payment_method(db, order["user_id"], a["payment_method_id"])
    if method["source"] == "gift_card" and method["balance"] < diff:
        raise Rejected("Insufficient gift card balance to pay for the new item")
    order = db.mut("orders", a["order_id"], "Order")
    order["payment_history"].append({"transaction_type": "payment" if diff > 0 else "refund",
                                     "amount": abs(diff),
                                     "payment_method_id": a["payment_method_id"]})
    if method["source"] == "gift_card":
        _add_to_gift_card(db, order["user_id"], a["payment_method_id"], -diff)
    for old_id, new_id in zip(a["item_ids"], a["new_item_ids"]):
        item = next(it for it in order["items"] if it["item_id"] == old_id)
        item["item_id"] = new_id
        # tau2-bench prices and labels every swapped item with the *last* new variant; kept
        # so that DB hashes agree with the benchmark's (it only matters for mixed swaps).
        item["price"] = variant["price"]
        item["options"] = copy.deepcopy(variant["options"])
    order["status"] = "pending (item modified)"
    return order


def modify_pending_order_payment(db: DomainDB, a: dict) -> dict:
    order = _order(db, a["order_id"])
    if "pending" not in order["status"]:
        raise Rejected("Non-pending order cannot be modified")
    method = _payment_method(db, order["user_id"], a["payment_method_id"])
    history = order["payment_history"]
    if len(history) != 1 or history[0]["transaction_type"] != "payment":
        raise Rejected("There should be exactly one payment for a pending order")
    old_id = history[0]["payment_method_id"]
    if old_id == a["payment_method_id"]:
        raise Rejected("The new payment method should be different from the current one")
    amount = history[0]["amount"]
    if method["source"] == "gift_card" and method["balance"] < amount:
        raise Rejected("Insufficient gift card balance to pay for the order")
    old_method = _payment_method(db, order["user_id"], old_id)
    order = db.mut("orders", a["order_id"], "Order")
    order["payment_history"].extend([
        {"transaction_type": "payment", "amount": amount, "payment_method_id": a["payment_method_id"]},
        {"transaction_type": "refund", "amount": amount, "payment_method_id": old_id}])
    if method["source"] == "gift_card":
        _add_to_gift_card(db, order["user_id"], a["payment_method_id"], -amount)
    if old_method["source"] == "gift_card":
        _add_to_gift_card(db, order["user_id"], old_id, amount)
    return order


def modify_user_address(db: DomainDB, a: dict) -> dict:
    user = db.mut("users", a["user_id"], "User")
    user["address"] = _address(a)
    return user


def return_delivered_order_items(db: DomainDB, a: dict) -> dict:
    order = _order(db, a["order_id"])
    if order["status"] != "delivered":
        raise Rejected("Non-delivered order cannot be returned")
    method = _payment_method(db, order["user_id"], a["payment_method_id"])
    if (method["source"] != "gift_card"
            and a["payment_method_id"] != order["payment_history"][0]["payment_method_id"]):
        raise Rejected("Payment method should be the original payment method or a gift card")
    _check_counts(order, a["item_ids"])
    order = db.mut("orders", a["order_id"], "Order")
    order["status"] = "return requested"
    order["return_items"] = sorted(a["item_ids"])
    order["return_payment_method_id"] = a["payment_method_id"]
    return order


_ORDER_ID = s("The order id, such as '#W0000000' (note the leading '#').")
_USER_ID = s("The user id, such as 'sara_doe_496'.")
_PM_ID = s("A payment method id from the user's profile, such as 'gift_card_0000000' or "
           "'credit_card_0000000'.")
_ITEMS = arr(s("An item id such as '1008292230'."), "Item ids; duplicates allowed.")
_ADDRESS = {"address1": s("First address line, such as '123 Main St'."),
            "address2": s("Second address line, such as 'Apt 1' or ''."),
            "city": s("City, such as 'San Francisco'."), "state": s("State, such as 'CA'."),
            "country": s("Country, such as 'USA'."), "zip": s("Zip code, such as '12345'.")}
_NEW_ITEMS = arr(s("A new item id."), "New item ids, position by position the same product "
                 "as item_ids.")
# exchange_delivered_order_items and modify_pending_order_items take the same arguments
_SWAP = obj({"order_id": _ORDER_ID, "item_ids": _ITEMS, "new_item_ids": _NEW_ITEMS,
             "payment_method_id": _PM_ID})

FUNCTIONS: tuple[DomainFunction, ...] = (
    CALCULATE,
    DomainFunction(name="cancel_pending_order", kind="write", fn=cancel_pending_order,
                   description="Cancel a pending order and refund its payments (gift cards at once, "
                               "others in 5-7 business days)." + CONFIRM,
                   parameters=obj({"order_id": _ORDER_ID,
                                   "reason": s("Why the order is cancelled.", _CANCEL_REASONS)})),
    DomainFunction(name="exchange_delivered_order_items", kind="write",
                   fn=exchange_delivered_order_items,
                   description="Exchange items of a delivered order for other variants of the same "
                               "product; allowed once per order." + CONFIRM,
                   parameters=_SWAP),
    DomainFunction(name="find_user_id_by_email", kind="read", fn=find_user_id_by_email,
                   description="Find a user id by email.",
                   parameters=obj({"email": s("Such as 'something@example.com'.")})),
    DomainFunction(name="find_user_id_by_name_zip", kind="read", fn=find_user_id_by_name_zip,
                   description="Find a user id by first name, last name and zip code; use it only "
                               "when the email is unknown.",
                   parameters=obj({"first_name": s("Such as 'John'."), "last_name": s("Such as 'Doe'."),
                                   "zip": s("Such as '12345'.")})),
    DomainFunction(name="get_order_details", kind="read", fn=lambda db, a: _order(db, a["order_id"]),
                   description="Status and details of an order.",
                   parameters=obj({"order_id": _ORDER_ID})),
    DomainFunction(name="get_product_details", kind="read",
                   fn=lambda db, a: db.get("products", a["product_id"], "Product"),
                   description="Inventory details (all variants) of a product.",
                   parameters=obj({"product_id": s("A product id such as '6086499569' (not an item id).")})),
    DomainFunction(name="get_user_details", kind="read",
                   fn=lambda db, a: db.get("users", a["user_id"], "User"),
                   description="Details of a user, including payment methods and orders.",
                   parameters=obj({"user_id": _USER_ID})),
    DomainFunction(name="list_all_product_types", kind="read", fn=list_all_product_types,
                   description="Names and product ids of all 50 product types, as JSON.",
                   parameters=obj({})),
    DomainFunction(name="modify_pending_order_address", kind="write", fn=modify_pending_order_address,
                   description="Change the shipping address of a pending order." + CONFIRM,
                   parameters=obj({"order_id": _ORDER_ID, **_ADDRESS})),
    DomainFunction(name="modify_pending_order_items", kind="write", fn=modify_pending_order_items,
                   description="Swap items of a pending order for other variants of the same product; "
                               "allowed once per order." + CONFIRM,
                   parameters=_SWAP),
    DomainFunction(name="modify_pending_order_payment", kind="write", fn=modify_pending_order_payment,
                   description="Change the payment method of a pending order." + CONFIRM,
                   parameters=obj({"order_id": _ORDER_ID, "payment_method_id": _PM_ID})),
    DomainFunction(name="modify_user_address", kind="write", fn=modify_user_address,
                   description="Change a user's default address." + CONFIRM,
                   parameters=obj({"user_id": _USER_ID, **_ADDRESS})),
    DomainFunction(name="return_delivered_order_items", kind="write", fn=return_delivered_order_items,
                   description="Request the return of items of a delivered order; the refund goes to "
                               "the original payment method or a gift card." + CONFIRM,
                   parameters=obj({"order_id": _ORDER_ID, "item_ids": _ITEMS, "payment_method_id": _PM_ID})),
    TRANSFER_TO_HUMAN_AGENTS,
)
