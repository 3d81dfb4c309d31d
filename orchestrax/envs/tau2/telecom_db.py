"""tau2 telecom state: the agent's CRM DB and the user's simulated phone, as plain JSON dicts.

Both are kept in the shape tau2-bench dumps them in JSON mode (enum values as strings, dates
as ISO strings, every field present with its default), so a state can be compared with the
benchmark's dump directly:

    agent DB: {"plans": [...], "customers": [...], "lines": [...], "bills": [...], "devices": [...]}
    user DB:  {"device": {...phone settings...}, "surroundings": {...where the phone is...}}

The benchmark's clock is frozen: every "today" is 2025-02-25.
"""

from __future__ import annotations

import copy
import datetime
import pathlib
import tomllib
from typing import Any

TODAY = datetime.date(2025, 2, 25)

# Per record type, the fields a TOML record may leave out and their defaults.
_AGENT_DEFAULTS: dict[str, dict[str, Any]] = {
    "plans": {},
    "devices": {"imei": None, "activated": False, "activation_date": None,
                "last_esim_transfer_date": None},
    "lines": {"status": "Pending Activation", "device_id": None, "data_used_gb": 0.0,
              "data_refueling_gb": 0.0, "roaming_enabled": False, "contract_end_date": None,
              "last_plan_change_date": None, "last_sim_replacement_date": None,
              "suspension_start_date": None},
    "bills": {"line_items": [], "status": "Draft"},
    "customers": {"account_status": "Pending Verification", "payment_methods": [], "line_ids": [],
                  "bill_ids": [], "created_at": "2025-01-01T00:00:00", "last_extension_date": None,
                  "goodwill_credit_used_this_year": 0.0},
}
_REQUIRED: dict[str, tuple[str, ...]] = {
    "plans": ("plan_id", "name", "data_limit_gb", "price_per_month", "data_refueling_price_per_gb"),
    "devices": ("device_id", "device_type", "model", "is_esim_capable"),
    "lines": ("line_id", "phone_number", "plan_id"),
    "bills": ("bill_id", "customer_id", "period_start", "period_end", "issue_date", "total_due",
              "due_date"),
    "customers": ("customer_id", "full_name", "date_of_birth", "email", "phone_number", "address"),
}
# Fields the benchmark types as float: a TOML integer (5) is dumped as 5.0 there.
_FLOATS = {"plans": ("data_limit_gb", "price_per_month", "data_refueling_price_per_gb"),
           "lines": ("data_used_gb", "data_refueling_gb"), "bills": ("total_due",),
           "customers": ("goodwill_credit_used_this_year",)}

APN_DEFAULTS: dict[str, Any] = {"apn_name": "internet", "reset_at_reboot": False, "mms_apn": "mms",
                                "mmsc_url": "http://mms.carrier.com/mms/wapenc", "mms_proxy": None,
                                "mms_port": None}
PERMISSIONS = ("sms", "storage", "phone", "network")
# The VPN every `connect_vpn` dials; copied per phone (the benchmark shares one object).
DEFAULT_VPN = {"server_address": "192.168.1.1", "protocol": "OpenVPN",
               "server_performance": "excellent"}

_DEVICE_DEFAULTS: dict[str, Any] = {
    "sim_card_status": "active", "sim_card_missing": False, "airplane_mode": False,
    "network_signal_strength": "good", "network_technology_connected": "5G",
    "network_connection_status": "connected", "battery_level": 80, "data_enabled": True,
    "roaming_enabled": False, "network_mode_preference": "4g_5g_preferred",
    "active_apn_settings": APN_DEFAULTS, "wifi_enabled": False, "wifi_connected": False,
    "wifi_ssid": None, "wifi_signal_strength": "none", "wifi_calling_enabled": False,
    "wifi_calling_mms_over_wifi": False, "data_saver_mode": False, "vpn_enabled_setting": False,
    "vpn_connected": False, "vpn_details": None,
    "app_statuses": {
        "messaging": {"app_name": "messaging",
                      "permissions": {"sms": True, "storage": True, "phone": True, "network": False}},
        "browser": {"app_name": "browser",
                    "permissions": {"sms": False, "storage": True, "phone": False, "network": True}},
    },
}
_SURROUNDINGS_DEFAULTS: dict[str, Any] = {
    "name": None, "phone_number": None, "is_abroad": False, "roaming_allowed": False,
    "signal_strength": {"2G": "poor", "3G": "fair", "4G": "good", "5G": "excellent"},
    "mobile_data_usage_exceeded": False, "line_active": True, "payment_request": None,
}


def _iso(value: Any) -> Any:
    """TOML may give real dates; the JSON dump has ISO strings."""
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time)):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _iso(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_iso(v) for v in value]
    return value


def normalise_agent_db(raw: dict[str, Any], source: str = "agent DB") -> dict[str, Any]:
    """Every table present, every record with every field (defaults filled), floats as floats."""
    unknown = sorted(set(raw) - set(_AGENT_DEFAULTS))
    if unknown:
        raise ValueError(f"{source}: unknown tables {unknown}; allowed: {sorted(_AGENT_DEFAULTS)}")
    db: dict[str, Any] = {}
    for table, defaults in _AGENT_DEFAULTS.items():
        rows = raw.get(table, [])
        if not isinstance(rows, list):
            raise ValueError(f"{source}: table {table!r} is a {type(rows).__name__}; expected a list")
        out = []
        for k, row in enumerate(rows):
            missing = [f for f in _REQUIRED[table] if f not in row]
            if missing:
                raise ValueError(f"{source}: {table}[{k}] lacks required fields {missing}")
            record = {**copy.deepcopy(defaults), **_iso(row)}
            for f in _FLOATS.get(table, ()):
                record[f] = float(record[f])
            if table == "bills":
                for item in record["line_items"]:
                    item["amount"] = float(item["amount"])
            out.append(record)
        db[table] = out
    return db


def _merge(defaults: dict[str, Any], given: dict[str, Any], where: str) -> dict[str, Any]:
    out = copy.deepcopy(defaults)
    for key, value in given.items():
        if key not in defaults:
            raise ValueError(f"{where}: unknown field {key!r}; allowed: {sorted(defaults)}")
        if isinstance(defaults[key], dict) and isinstance(value, dict) and key not in (
                "app_statuses", "signal_strength"):
            out[key] = _merge(defaults[key], value, f"{where}.{key}")
        else:
            out[key] = _iso(value)
    return out


def normalise_user_db(raw: dict[str, Any], source: str = "user DB") -> dict[str, Any]:
    """The phone's state with every default filled (app permissions default to False)."""
    device = _merge(_DEVICE_DEFAULTS, raw.get("device") or {}, f"{source} device")
    apps = {}
    for name, app in device["app_statuses"].items():
        perms = {p: False for p in PERMISSIONS}
        for p, v in (app.get("permissions") or {}).items():
            if p not in perms:
                raise ValueError(f"{source}: app {name!r} permission {p!r}; allowed: {PERMISSIONS}")
            perms[p] = bool(v)
        apps[name] = {"app_name": app.get("app_name", name), "permissions": perms}
    device["app_statuses"] = apps
    surroundings = _merge(_SURROUNDINGS_DEFAULTS, raw.get("surroundings") or {},
                          f"{source} surroundings")
    return {"device": device, "surroundings": surroundings}


def read_toml(path: pathlib.Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML ({e})") from None


class TelecomState:
    """One episode's two databases. `new_bill_ids` numbers the draft bills a charge opens when
    a customer has none (the benchmark draws a random id there; ours is deterministic)."""

    def __init__(self, agent: dict[str, Any], user: dict[str, Any]):
        self.agent = agent
        self.user = user
        self.new_bill_ids = 0

    @property
    def device(self) -> dict[str, Any]:
        return self.user["device"]

    @property
    def surroundings(self) -> dict[str, Any]:
        return self.user["surroundings"]
