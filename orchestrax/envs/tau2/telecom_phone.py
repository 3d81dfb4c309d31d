"""The telecom user's phone: its state machine (network search, data, speed test, MMS), the
setup functions tasks use to break it (`break_apn_settings`, `break_vpn`, `unseat_sim_card`, ...)
and the assertions a task's reward checks. tau2-bench semantics, our code. The speed test is
deterministic: the midpoint of the technology's range times signal and VPN / data-saver factors.
The tools the simulated user calls are in `telecom_user`.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Callable

from orchestrax.envs.tau2.telecom_db import DEFAULT_VPN, PERMISSIONS, TelecomState

MODES = ["4g_5g_preferred", "4g_only", "3g_only", "2g_only"]
NETWORK_STATUSES = ["connected", "searching", "no_service", "emergency_only"]
_MODE_TECH = {"4g_only": "4G", "3g_only": "3G", "2g_only": "2G"}
_BARS = {"none": "No Signal", "poor": "1 bar (Poor)", "fair": "2 bars (Fair)",
         "good": "3 bars (Good)", "excellent": "4 bars (Excellent)"}
_SPEED_RANGE_MBPS = {"2G": (0.1, 0.4), "3G": (1.0, 5.0), "4G": (10.0, 100.0),
                     "5G": (50.0, 500.0), "none": (0.0, 0.0)}
_SIGNAL_FACTOR = {"none": 0.0, "poor": 0.2, "fair": 0.5, "good": 0.8, "excellent": 1.0}
SPEED_ADVICE = {"Very Poor": "Basic web browsing may be difficult.",
                 "Poor": "Browsing may be sluggish; streaming is difficult.",
                 "Fair": "Fine for browsing and standard-definition video.",
                 "Good": "Fine for most uses, HD video included.",
                 "Excellent": "A very fast connection."}


# ---- the phone's physics ------------------------------------------------------------------------

def sim_status(st: TelecomState) -> str:
    return "missing" if st.device["sim_card_missing"] else st.device["sim_card_status"]


def _no_service(d: dict) -> None:
    d["network_connection_status"] = "no_service"
    d["network_technology_connected"] = "none"
    d["network_signal_strength"] = "none"


def network_search(st: TelecomState) -> None:
    """Re-register on the network: the technology the mode preference and the local signal
    allow, or no service (no usable SIM, airplane mode, a broken APN, an inactive line)."""
    d, signal = st.device, st.surroundings["signal_strength"]
    if sim_status(st) == "active":
        d["network_connection_status"] = "connected"
        tech = _MODE_TECH.get(d["network_mode_preference"])
        if tech is None:  # 4g_5g_preferred: 5G where there is any 5G signal
            tech = "4G" if signal.get("5G", "none") == "none" else "5G"
        d["network_technology_connected"] = tech
        d["network_signal_strength"] = signal.get(tech, "none")
    else:
        _no_service(d)
    if (d["airplane_mode"] or d["active_apn_settings"]["apn_name"] == "broken"
            or not st.surroundings["line_active"]):
        _no_service(d)


def mobile_data_working(st: TelecomState) -> bool:
    d, sur = st.device, st.surroundings
    if d["airplane_mode"] or d["network_signal_strength"] == "none":
        return False
    if d["network_connection_status"] == "no_service":
        return False
    if sur["is_abroad"] and not (d["roaming_enabled"] and sur["roaming_allowed"]):
        return False
    return d["data_enabled"] and not sur["mobile_data_usage_exceeded"]


def speed(st: TelecomState) -> tuple[float | None, str]:
    """(Mbps, description); (None, "No Connection") without working mobile data."""
    d = st.device
    if not mobile_data_working(st):
        return None, "No Connection"
    factor = 1.0
    if d["vpn_connected"] and d["vpn_details"] and d["vpn_details"]["server_performance"] == "poor":
        factor = 0.1
    if d["data_saver_mode"]:
        factor *= 0.2
    low, high = _SPEED_RANGE_MBPS.get(d["network_technology_connected"], (0.0, 0.0))
    mbps = round((low + high) / 2.0 * _SIGNAL_FACTOR.get(d["network_signal_strength"], 0.0) * factor, 2)
    for limit, desc in ((1, "Very Poor"), (5, "Poor"), (25, "Fair"), (100, "Good")):
        if mbps < limit:
            return mbps, desc
    return mbps, "Excellent"


def mms_works(st: TelecomState) -> bool:
    d = st.device
    if not mobile_data_working(st) or d["network_technology_connected"] == "2G":
        return False
    if d["wifi_calling_enabled"] and d["wifi_calling_mms_over_wifi"]:
        return False  # MMS routed over Wi-Fi calling fails in this scenario
    if d["active_apn_settings"]["mmsc_url"] is None:
        return False
    app = d["app_statuses"].get("messaging")
    return app is not None and app["permissions"]["storage"] and app["permissions"]["sms"]


def status_bar(st: TelecomState) -> str:
    d = st.device
    parts = []
    if d["airplane_mode"]:
        parts.append("Airplane Mode")
    else:
        parts.append(_BARS.get(d["network_signal_strength"], "No Signal"))
        tech = d["network_technology_connected"]
        if tech != "none":
            parts.append(tech)
        if d["data_enabled"] and tech != "none":
            parts.append("Data Enabled" + (" | Data Saver" if d["data_saver_mode"] else ""))
        else:
            parts.append("Data Disabled")
    if d["wifi_enabled"] and d["wifi_connected"]:
        parts.append(f"Wi-Fi: {d['wifi_ssid']}" if d["wifi_ssid"] else "Wi-Fi On")
    if d["vpn_connected"]:
        parts.append("VPN Connected")
    parts.append(f"Battery {d['battery_level']}%")
    return "Status Bar: " + " | ".join(parts)


def with_bar(st: TelecomState, text: str) -> str:
    return f"{text}\n{status_bar(st)}"


def drop_vpn(d: dict) -> bool:
    if not d["vpn_connected"]:
        return False
    d["vpn_connected"], d["vpn_details"] = False, None
    return True


def dial_vpn(d: dict) -> bool:
    if d["vpn_connected"]:
        return False
    # a copy per phone: breaking one phone's VPN must not break every other episode's
    d["vpn_connected"], d["vpn_details"] = True, copy.deepcopy(DEFAULT_VPN)
    return True


def wifi_off(d: dict) -> None:
    d["wifi_connected"], d["wifi_ssid"], d["wifi_signal_strength"] = False, None, "none"


def flip_airplane(st: TelecomState) -> bool:
    d = st.device
    turning_on = not d["airplane_mode"]
    d["airplane_mode"] = turning_on
    if turning_on:
        wifi_off(d)
        drop_vpn(d)
    else:
        d["network_connection_status"] = "searching"
        if d["wifi_enabled"]:
            wifi_off(d)
    network_search(st)
    return turning_on


def _flip_field(field: str, search: bool) -> Callable[[TelecomState], bool]:
    def flip(st: TelecomState) -> bool:
        st.device[field] = not st.device[field]
        if search:
            network_search(st)
        return st.device[field]
    return flip


@dataclasses.dataclass(frozen=True)
class Switch:
    """An on/off setting of the phone. `flip(st)` flips it, lets the phone react (re-register,
    drop Wi-Fi) and returns the new value; `label` is what the phone calls it on screen."""

    label: str
    flip: Callable[[TelecomState], bool]


# The benchmark's one-tap switches: the user's toggle_<key> tools and the turn_<key>_on/off
# setup functions are all made from this table.
SWITCHES: dict[str, Switch] = {
    "airplane_mode": Switch("Airplane Mode", flip_airplane),
    "data": Switch("Mobile Data", _flip_field("data_enabled", search=True)),
    "roaming": Switch("Data Roaming", _flip_field("roaming_enabled", search=True)),
    "data_saver_mode": Switch("Data Saver Mode", _flip_field("data_saver_mode", search=False)),
    "wifi_calling": Switch("Wi-Fi Calling", _flip_field("wifi_calling_enabled", search=False)),
}


def on_off(flag: bool) -> str:
    return "ON" if flag else "OFF"


def turn(st: TelecomState, switch: str, want: bool) -> str:
    """The benchmark's turn_<switch>_on/off: flip, and flip back if that went the wrong way (so
    the phone reacts twice, as there)."""
    sw = SWITCHES[switch]
    if sw.flip(st) != want:
        sw.flip(st)
    return f"{sw.label} is now {on_off(want)}."


def set_permission(st: TelecomState, app_name: str, permission: str, value: bool) -> tuple[bool, str]:
    app = st.device["app_statuses"].get(app_name)
    permission = permission.lower()
    if app is None:
        return False, f"App '{app_name}' is not installed."
    if permission not in PERMISSIONS:
        return False, f"Permission '{permission}' is not tracked for app '{app_name}'; " \
                      f"tracked: {list(PERMISSIONS)}"
    app["permissions"][permission] = value
    return True, f"Permission '{permission}' {'granted to' if value else 'removed from'} app '{app_name}'."


# ---- setup functions ----------------------------------------------------------------------------

def set_user_info(st: TelecomState, a: dict) -> None:
    st.surroundings["name"], st.surroundings["phone_number"] = a["name"], a["phone_number"]


def set_user_location(st: TelecomState, a: dict) -> None:
    st.surroundings["is_abroad"] = a["abroad"]


def simulate_network_search(st: TelecomState, a: dict) -> None:
    network_search(st)


def unseat_sim_card(st: TelecomState, a: dict) -> str:
    st.device["sim_card_missing"] = True
    network_search(st)
    return "SIM card removed."


def lock_sim_card(st: TelecomState, a: dict) -> str:
    st.device["sim_card_status"] = {"pin": "locked_pin", "puk": "locked_puk"}[a["mode"]]
    network_search(st)
    return f"SIM card locked ({a['mode']})."


def turn_data_on(st: TelecomState, a: dict) -> str:
    # the one turn_* that sets rather than flips: no network search, as in the benchmark
    st.device["data_enabled"] = True
    return "Mobile Data is now ON."


# The other turn_<switch>_on/off setup functions: `turn` over SWITCHES (named in telecom_user).
TURNS: tuple[tuple[str, bool], ...] = (
    ("airplane_mode", True), ("airplane_mode", False), ("data", False), ("roaming", True),
    ("roaming", False), ("data_saver_mode", True), ("data_saver_mode", False))


def break_apn_settings(st: TelecomState, a: dict) -> str:
    st.device["active_apn_settings"]["apn_name"] = "broken"
    network_search(st)
    return "APN settings broken."


def break_apn_mms_setting(st: TelecomState, a: dict) -> str:
    st.device["active_apn_settings"]["mmsc_url"] = None
    return "APN MMS setting broken."


def break_vpn(st: TelecomState, a: dict) -> str:
    """Connect the VPN (if it is not) and make its server slow, on this phone only."""
    dial_vpn(st.device)
    st.device["vpn_details"]["server_performance"] = "poor"
    return "VPN connection broken."


def set_wifi_calling(st: TelecomState, a: dict) -> str:
    st.device["wifi_calling_enabled"] = a["enabled"]
    if a.get("mms_over_wifi") is not None:
        st.device["wifi_calling_mms_over_wifi"] = a["mms_over_wifi"]
    return f"Wi-Fi Calling is {on_off(a['enabled'])}."


def remove_app_permission(st: TelecomState, a: dict) -> str:
    return set_permission(st, a["app_name"], a["permission"], False)[1]


# ---- assertions ---------------------------------------------------------------------------------

def assert_airplane_mode_status(st: TelecomState, a: dict) -> bool:
    return st.device["airplane_mode"] == a["expected_status"]


def assert_service_status(st: TelecomState, a: dict) -> bool:
    return st.device["network_connection_status"] == a["expected_status"]


def assert_mobile_data_status(st: TelecomState, a: dict) -> bool:
    return mobile_data_working(st) == a["expected_status"]


def assert_mobile_roaming_status(st: TelecomState, a: dict) -> bool:
    return st.device["roaming_enabled"] == a["expected_status"]


def assert_mobile_data_saver_mode_status(st: TelecomState, a: dict) -> bool:
    return st.device["data_saver_mode"] == a["expected_status"]


def assert_internet_speed(st: TelecomState, a: dict) -> bool:
    """At least `expected_speed` Mbps and, if given, the description (any case)."""
    mbps, desc = speed(st)
    fast = (mbps or 0.0) >= a["expected_speed"]
    want = a.get("expected_desc")
    return fast if want is None else fast and desc.lower() == want.lower()


def assert_internet_not_excellent(st: TelecomState, a: dict) -> bool:
    return speed(st)[1].lower() != "excellent"


def assert_can_send_mms(st: TelecomState, a: dict) -> bool:
    return mms_works(st) == a["expected_status"]


def assert_mobile_data_usage_exceeded(st: TelecomState, a: dict) -> bool:
    return st.surroundings["mobile_data_usage_exceeded"] == a["expected_status"]
