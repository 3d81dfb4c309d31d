"""The telecom user's side: a simulated phone (`state.device`) in its surroundings.

30 tools the simulated user may call (check the status bar, toggle airplane mode, run a speed
test, pay a bill, ...), the setup functions tasks use to break the phone (`break_apn_settings`,
`break_vpn`, `unseat_sim_card`, ...) and the assertions a task's reward checks. tau2-bench
semantics, our code. The speed test is deterministic: the midpoint of the technology's range
times signal and VPN / data-saver factors.
"""

from __future__ import annotations

import copy
from typing import Any

from orchestrax.envs.tau2.db import Rejected
from orchestrax.envs.tau2.functions import obj, s
from orchestrax.envs.tau2.telecom_db import (APN_DEFAULTS, DEFAULT_VPN, PERMISSIONS,
                                             TelecomFunction, TelecomState)

MODES = ["4g_5g_preferred", "4g_only", "3g_only", "2g_only"]
NETWORK_STATUSES = ["connected", "searching", "no_service", "emergency_only"]
_MODE_TECH = {"4g_only": "4G", "3g_only": "3G", "2g_only": "2G"}
_BARS = {"none": "No Signal", "poor": "1 bar (Poor)", "fair": "2 bars (Fair)",
         "good": "3 bars (Good)", "excellent": "4 bars (Excellent)"}
_SPEED_RANGE_MBPS = {"2G": (0.1, 0.4), "3G": (1.0, 5.0), "4G": (10.0, 100.0),
                     "5G": (50.0, 500.0), "none": (0.0, 0.0)}
_SIGNAL_FACTOR = {"none": 0.0, "poor": 0.2, "fair": 0.5, "good": 0.8, "excellent": 1.0}
_SPEED_ADVICE = {"Very Poor": "Basic web browsing may be difficult.",
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


def _with_bar(st: TelecomState, text: str) -> str:
    return f"{text}\n{status_bar(st)}"


def _disconnect_vpn(d: dict) -> bool:
    if not d["vpn_connected"]:
        return False
    d["vpn_connected"], d["vpn_details"] = False, None
    return True


def _connect_vpn(d: dict) -> bool:
    if d["vpn_connected"]:
        return False
    # a copy per phone: breaking one phone's VPN must not break every other episode's
    d["vpn_connected"], d["vpn_details"] = True, copy.deepcopy(DEFAULT_VPN)
    return True


def _wifi_off(d: dict) -> None:
    d["wifi_connected"], d["wifi_ssid"], d["wifi_signal_strength"] = False, None, "none"


def _toggle_airplane(st: TelecomState) -> bool:
    d = st.device
    turning_on = not d["airplane_mode"]
    d["airplane_mode"] = turning_on
    if turning_on:
        _wifi_off(d)
        _disconnect_vpn(d)
    else:
        d["network_connection_status"] = "searching"
        if d["wifi_enabled"]:
            _wifi_off(d)
    network_search(st)
    return turning_on


def _toggle(st: TelecomState, field: str, search: bool) -> bool:
    st.device[field] = not st.device[field]
    if search:
        network_search(st)
    return st.device[field]


def _set_by_toggling(st: TelecomState, field: str, want: bool, search: bool) -> None:
    """The benchmark's turn_*_on/off: toggle, and toggle back if that went the wrong way."""
    if _toggle(st, field, search) != want:
        _toggle(st, field, search)


def _on_off(flag: bool) -> str:
    return "ON" if flag else "OFF"


# ---- tools --------------------------------------------------------------------------------------

def check_status_bar(st: TelecomState, a: dict) -> str:
    return status_bar(st)


def check_network_status(st: TelecomState, a: dict) -> str:
    d = st.device
    lines = [f"Airplane Mode: {_on_off(d['airplane_mode'])}", f"SIM Card Status: {sim_status(st)}",
             f"Cellular Connection: {d['network_connection_status']}",
             f"Cellular Signal: {d['network_signal_strength']}",
             f"Cellular Network Type: {d['network_technology_connected']}",
             f"Mobile Data Enabled: {'Yes' if d['data_enabled'] else 'No'}",
             f"Data Roaming Enabled: {'Yes' if d['roaming_enabled'] else 'No'}",
             f"Wi-Fi Radio: {_on_off(d['wifi_enabled'])}",
             f"Wi-Fi Connected: {'Yes' if d['wifi_connected'] else 'No'}"]
    if d["wifi_connected"]:
        lines.append(f"Connected Wi-Fi Network: {d['wifi_ssid']}")
    return "\n".join(lines)


def check_network_mode_preference(st: TelecomState, a: dict) -> str:
    return f"Network Mode Preference: {st.device['network_mode_preference']}"


def set_network_mode_preference(st: TelecomState, a: dict) -> str:
    if a["mode"] not in MODES:  # the phone answers; nothing raises
        return _with_bar(st, f"Failed to set network mode: {a['mode']!r} is not a valid option; "
                             f"choose one of {', '.join(MODES)}")
    st.device["network_mode_preference"] = a["mode"]
    network_search(st)
    return _with_bar(st, f"Preferred Network Mode set to: {a['mode']}")


def run_speed_test(st: TelecomState, a: dict) -> str:
    mbps, desc = speed(st)
    if mbps is None:
        return f"Speed test failed: {desc}."
    return f"Speed Test Result: {mbps:.2f} Mbps ({desc}). {_SPEED_ADVICE[desc]}"


def toggle_airplane_mode(st: TelecomState, a: dict) -> str:
    return _with_bar(st, f"Airplane Mode is now {_on_off(_toggle_airplane(st))}.")


def check_sim_status(st: TelecomState, a: dict) -> str:
    return {"active": "The SIM card is active and working.",
            "missing": "No SIM card is detected in the phone.",
            "locked_pin": "The SIM card is locked with a PIN code.",
            "locked_puk": "The SIM card is locked with a PUK code."}[sim_status(st)]


def reseat_sim_card(st: TelecomState, a: dict) -> str:
    st.device["sim_card_missing"] = False
    network_search(st)
    return _with_bar(st, "SIM card re-seated successfully.")


def toggle_data(st: TelecomState, a: dict) -> str:
    return _with_bar(st, f"Mobile Data is now {_on_off(_toggle(st, 'data_enabled', True))}.")


def toggle_roaming(st: TelecomState, a: dict) -> str:
    return _with_bar(st, f"Data Roaming is now {_on_off(_toggle(st, 'roaming_enabled', True))}.")


def check_data_restriction_status(st: TelecomState, a: dict) -> str:
    return f"Data Saver mode is {_on_off(st.device['data_saver_mode'])}."


def toggle_data_saver_mode(st: TelecomState, a: dict) -> str:
    return _with_bar(st, f"Data Saver Mode is now {_on_off(_toggle(st, 'data_saver_mode', False))}.")


def check_apn_settings(st: TelecomState, a: dict) -> str:
    apn = st.device["active_apn_settings"]
    return (f"Current APN Name: {apn['apn_name'] or 'Not Set'}\n"
            f"MMSC URL (for picture messages): {apn['mmsc_url'] or 'Not Set'}")


def set_apn_settings(st: TelecomState, a: dict) -> str:
    given = a["apn_settings"]
    unknown = sorted(set(given) - set(APN_DEFAULTS))
    if unknown:
        raise Rejected(f"apn_settings has unknown fields {unknown}; allowed: {sorted(APN_DEFAULTS)}")
    apn = {**APN_DEFAULTS, **given}
    if apn["apn_name"] not in ("internet", "broken"):
        raise Rejected(f"apn_settings.apn_name={apn['apn_name']!r}; allowed: ['internet', 'broken']")
    st.device["active_apn_settings"] = apn
    network_search(st)
    return _with_bar(st, f"APN settings set to: {apn['apn_name']}")


def reset_apn_settings(st: TelecomState, a: dict) -> str:
    st.device["active_apn_settings"]["reset_at_reboot"] = True
    network_search(st)
    return _with_bar(st, "APN settings will reset at reboot.")


def check_wifi_status(st: TelecomState, a: dict) -> str:
    d = st.device
    if not d["wifi_enabled"]:
        return "Wi-Fi is turned OFF."
    if d["wifi_connected"]:
        return f"Wi-Fi is ON and connected to '{d['wifi_ssid']}'. Signal: {d['wifi_signal_strength']}."
    return "Wi-Fi is ON but not connected to any network."


def toggle_wifi(st: TelecomState, a: dict) -> str:
    d = st.device
    if d["airplane_mode"]:
        return _with_bar(st, "Wi-Fi cannot be changed while Airplane Mode is ON.")
    d["wifi_enabled"] = not d["wifi_enabled"]
    if not d["wifi_enabled"]:
        _wifi_off(d)
    return _with_bar(st, f"Wi-Fi is now {_on_off(d['wifi_enabled'])}.")


def check_wifi_calling_status(st: TelecomState, a: dict) -> str:
    return f"Wi-Fi Calling is {_on_off(st.device['wifi_calling_enabled'])}."


def toggle_wifi_calling(st: TelecomState, a: dict) -> str:
    return _with_bar(st, f"Wi-Fi Calling is now {_on_off(_toggle(st, 'wifi_calling_enabled', False))}.")


def check_vpn_status(st: TelecomState, a: dict) -> str:
    d = st.device
    if d["vpn_connected"]:
        return f"VPN is ON and connected. Details: {d['vpn_details']}"
    if d["vpn_enabled_setting"]:
        return "VPN is ON in settings but not connected."
    return "VPN is OFF."


def connect_vpn(st: TelecomState, a: dict) -> str:
    if not _connect_vpn(st.device):
        return "VPN already connected."
    return _with_bar(st, "VPN connected successfully.")


def disconnect_vpn(st: TelecomState, a: dict) -> str:
    done = _disconnect_vpn(st.device)
    return _with_bar(st, "VPN disconnected successfully." if done
                     else "No active VPN connection to disconnect.")


def check_installed_apps(st: TelecomState, a: dict) -> str:
    return f"Installed apps: {', '.join(st.device['app_statuses'])}"


def _granted(app: dict) -> list[str]:
    return [p for p, ok in app["permissions"].items() if ok]


def check_app_status(st: TelecomState, a: dict) -> str:
    app = st.device["app_statuses"].get(a["app_name"])
    if app is None:
        return f"App '{a['app_name']}' is not installed on this phone."
    granted = _granted(app)
    return (f"Status for App: {a['app_name']}\n - Permissions granted: "
            + (", ".join(granted) if granted else "none"))


def check_app_permissions(st: TelecomState, a: dict) -> str:
    app = st.device["app_statuses"].get(a["app_name"])
    if app is None:
        return f"App '{a['app_name']}' is not installed on this phone."
    granted = _granted(app)
    if not granted:
        return f"App '{a['app_name']}' has no permissions granted."
    return f"App '{a['app_name']}' has permission for: {', '.join(granted)}."


def _set_permission(st: TelecomState, app_name: str, permission: str, value: bool) -> tuple[bool, str]:
    app = st.device["app_statuses"].get(app_name)
    permission = permission.lower()
    if app is None:
        return False, f"App '{app_name}' is not installed."
    if permission not in PERMISSIONS:
        return False, f"Permission '{permission}' is not tracked for app '{app_name}'; " \
                      f"tracked: {list(PERMISSIONS)}"
    app["permissions"][permission] = value
    return True, f"Permission '{permission}' {'granted to' if value else 'removed from'} app '{app_name}'."


def grant_app_permission(st: TelecomState, a: dict) -> str:
    ok, msg = _set_permission(st, a["app_name"], a["permission"], True)
    return _with_bar(st, f"{'Success' if ok else 'Error'}. {msg}")


def can_send_mms(st: TelecomState, a: dict) -> str:
    return f"The messaging app {'can' if mms_works(st) else 'cannot'} send MMS messages."


def reboot_device(st: TelecomState, a: dict) -> str:
    d = st.device
    lines = []
    if d["active_apn_settings"]["reset_at_reboot"]:
        lines.append("Resetting APN settings...")
        d["active_apn_settings"] = dict(APN_DEFAULTS)
    lines.append("Restarting network services...")
    d["network_connection_status"] = "searching"
    network_search(st)
    return _with_bar(st, "\n".join(lines))


def check_payment_request(st: TelecomState, a: dict) -> str:
    req = st.surroundings["payment_request"]
    if req is None:
        return "No payment request has been made."
    return f"You have a payment request for bill {req['bill_id']} of {req['amount_due']} USD."


def make_payment(st: TelecomState, a: dict) -> str:
    req = st.surroundings["payment_request"]
    if req is None:
        return "You do not have a payment request."
    req["paid"] = True  # the next sync marks the bill paid on the agent side
    return f"Payment of {req['amount_due']} USD has been made for bill {req['bill_id']}."


# ---- setup functions ----------------------------------------------------------------------------

def set_user_info(st: TelecomState, a: dict) -> None:
    st.surroundings["name"], st.surroundings["phone_number"] = a["name"], a["phone_number"]


def set_user_location(st: TelecomState, a: dict) -> None:
    st.surroundings["is_abroad"] = a["abroad"]


def simulate_network_search(st: TelecomState, a: dict) -> None:
    network_search(st)


def turn_airplane_mode_on(st: TelecomState, a: dict) -> str:
    if not _toggle_airplane(st):
        _toggle_airplane(st)
    return "Airplane Mode is now ON."


def turn_airplane_mode_off(st: TelecomState, a: dict) -> str:
    if _toggle_airplane(st):
        _toggle_airplane(st)
    return "Airplane Mode is now OFF."


def unseat_sim_card(st: TelecomState, a: dict) -> str:
    st.device["sim_card_missing"] = True
    network_search(st)
    return "SIM card removed."


def lock_sim_card(st: TelecomState, a: dict) -> str:
    st.device["sim_card_status"] = {"pin": "locked_pin", "puk": "locked_puk"}[a["mode"]]
    network_search(st)
    return f"SIM card locked ({a['mode']})."


def turn_data_on(st: TelecomState, a: dict) -> str:
    st.device["data_enabled"] = True  # no network search, as in the benchmark
    return "Mobile data is ON."


def turn_data_off(st: TelecomState, a: dict) -> str:
    _set_by_toggling(st, "data_enabled", False, search=True)
    return "Mobile data is OFF."


def turn_roaming_on(st: TelecomState, a: dict) -> str:
    _set_by_toggling(st, "roaming_enabled", True, search=True)
    return "Data Roaming is ON."


def turn_roaming_off(st: TelecomState, a: dict) -> str:
    _set_by_toggling(st, "roaming_enabled", False, search=True)
    return "Data Roaming is OFF."


def turn_data_saver_mode_on(st: TelecomState, a: dict) -> str:
    _set_by_toggling(st, "data_saver_mode", True, search=False)
    return "Data Saver Mode is ON."


def turn_data_saver_mode_off(st: TelecomState, a: dict) -> str:
    _set_by_toggling(st, "data_saver_mode", False, search=False)
    return "Data Saver Mode is OFF."


def break_apn_settings(st: TelecomState, a: dict) -> str:
    st.device["active_apn_settings"]["apn_name"] = "broken"
    network_search(st)
    return "APN settings broken."


def break_apn_mms_setting(st: TelecomState, a: dict) -> str:
    st.device["active_apn_settings"]["mmsc_url"] = None
    return "APN MMS setting broken."


def break_vpn(st: TelecomState, a: dict) -> str:
    """Connect the VPN (if it is not) and make its server slow, on this phone only."""
    _connect_vpn(st.device)
    st.device["vpn_details"]["server_performance"] = "poor"
    return "VPN connection broken."


def set_wifi_calling(st: TelecomState, a: dict) -> str:
    st.device["wifi_calling_enabled"] = a["enabled"]
    if a.get("mms_over_wifi") is not None:
        st.device["wifi_calling_mms_over_wifi"] = a["mms_over_wifi"]
    return f"Wi-Fi Calling is {_on_off(a['enabled'])}."


def remove_app_permission(st: TelecomState, a: dict) -> str:
    return _set_permission(st, a["app_name"], a["permission"], False)[1]


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


_NONE = obj({})
_APP = s("App name, e.g. messaging or browser")
_PERM = s("Permission, e.g. sms, storage, phone or network")
_BOOL = {"type": "boolean"}


def _f(fn, kind: str, description: str, parameters: dict = _NONE) -> TelecomFunction:
    return TelecomFunction(name=fn.__name__, description=description, parameters=parameters,
                           kind=kind, fn=fn)


def _e(fn, parameters: dict = _NONE) -> TelecomFunction:
    return _f(fn, "env", (fn.__doc__ or fn.__name__.replace("_", " ")).strip(), parameters)


def _a(fn, parameters: dict) -> TelecomFunction:
    return _f(fn, "assert", "", parameters)


FUNCTIONS: tuple[TelecomFunction, ...] = (
    _f(check_status_bar, "read", "What the phone's status bar shows: signal, network type, "
       "data, Wi-Fi, VPN, airplane mode, battery."),
    _f(check_network_status, "read", "The phone's detailed network status: airplane mode, SIM, "
       "cellular connection, signal, network type, mobile data, roaming, Wi-Fi."),
    _f(check_network_mode_preference, "read", "The preferred network mode (e.g. 4g_5g_preferred)."),
    _f(set_network_mode_preference, "write", "Set the preferred network mode.",
       obj({"mode": s("One of " + ", ".join(MODES))})),
    _f(run_speed_test, "read", "Measure the mobile data speed."),
    _f(toggle_airplane_mode, "write", "Switch airplane mode on or off."),
    _f(check_sim_status, "read", "Whether the SIM card is active, missing or locked."),
    _f(reseat_sim_card, "write", "Take the SIM card out and put it back in."),
    _f(toggle_data, "write", "Switch mobile data on or off."),
    _f(toggle_roaming, "write", "Switch data roaming on or off."),
    _f(check_data_restriction_status, "read", "Whether Data Saver mode is on."),
    _f(toggle_data_saver_mode, "write", "Switch Data Saver mode on or off."),
    _f(check_apn_settings, "read", "The phone's APN (access point) settings."),
    _f(set_apn_settings, "write", "Replace the APN settings.",
       obj({"apn_settings": {"type": "object", "description": "Fields: apn_name (internet or "
                             "broken), reset_at_reboot, mms_apn, mmsc_url, mms_proxy, mms_port"}})),
    _f(reset_apn_settings, "write", "Reset the APN settings to the defaults at the next reboot."),
    _f(check_wifi_status, "read", "Whether Wi-Fi is on and connected."),
    _f(toggle_wifi, "write", "Switch Wi-Fi on or off."),
    _f(check_wifi_calling_status, "read", "Whether Wi-Fi calling is on."),
    _f(toggle_wifi_calling, "write", "Switch Wi-Fi calling on or off."),
    _f(check_vpn_status, "read", "Whether a VPN is connected, and its details."),
    _f(connect_vpn, "write", "Connect the VPN."),
    _f(disconnect_vpn, "write", "Disconnect the VPN."),
    _f(check_installed_apps, "read", "The apps installed on the phone."),
    _f(check_app_status, "read", "An app's status and granted permissions.", obj({"app_name": _APP})),
    _f(check_app_permissions, "read", "The permissions an app has.", obj({"app_name": _APP})),
    _f(grant_app_permission, "write", "Grant an app a permission.",
       obj({"app_name": _APP, "permission": _PERM})),
    _f(can_send_mms, "read", "Whether the messaging app can send MMS (picture) messages."),
    _f(reboot_device, "write", "Restart the phone."),
    _f(check_payment_request, "read", "Whether the carrier has sent a payment request."),
    _f(make_payment, "write", "Pay the pending payment request."),
    _e(set_user_info, obj({"name": s("Name"), "phone_number": s("Phone number")})),
    _e(set_user_location, obj({"abroad": _BOOL})),
    _e(simulate_network_search), _e(turn_airplane_mode_on), _e(turn_airplane_mode_off),
    _e(unseat_sim_card), _e(lock_sim_card, obj({"mode": s("", ["pin", "puk"])})),
    _e(turn_data_on), _e(turn_data_off), _e(turn_roaming_on), _e(turn_roaming_off),
    _e(turn_data_saver_mode_on), _e(turn_data_saver_mode_off), _e(break_apn_settings),
    _e(break_apn_mms_setting), _e(break_vpn),
    _e(set_wifi_calling, obj({"enabled": _BOOL, "mms_over_wifi": {"type": ["boolean", "null"]}},
                             ["enabled"])),
    _e(remove_app_permission, obj({"app_name": _APP, "permission": _PERM})),
    _a(assert_airplane_mode_status, obj({"expected_status": _BOOL})),
    _a(assert_service_status, obj({"expected_status": s("", NETWORK_STATUSES)})),
    _a(assert_mobile_data_status, obj({"expected_status": _BOOL})),
    _a(assert_mobile_roaming_status, obj({"expected_status": _BOOL})),
    _a(assert_mobile_data_saver_mode_status, obj({"expected_status": _BOOL})),
    _a(assert_internet_speed, obj({"expected_speed": {"type": "number"},
                                   "expected_desc": {"type": ["string", "null"]}},
                                  ["expected_speed"])),
    _a(assert_internet_not_excellent, _NONE),
    _a(assert_can_send_mms, obj({"expected_status": _BOOL})),
    _a(assert_mobile_data_usage_exceeded, obj({"expected_status": _BOOL})),
)
