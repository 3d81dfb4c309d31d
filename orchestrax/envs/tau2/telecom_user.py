"""The telecom user's 30 phone tools (check the status bar, toggle airplane mode, run a speed
test, pay a bill, ...) and the table of every user-side function: tools, the setup functions
and assertions of `telecom_phone`. tau2-bench semantics, our code.
"""

from __future__ import annotations

from typing import Callable

from orchestrax.envs.tau2.db import Rejected
from orchestrax.envs.tau2.functions import DomainFunction, obj, s
from orchestrax.envs.tau2.functions import named as _f
from orchestrax.envs.tau2.telecom_db import APN_DEFAULTS, TelecomState
from orchestrax.envs.tau2 import telecom_phone as phone
from orchestrax.envs.tau2.telecom_phone import (MODES, NETWORK_STATUSES, SPEED_ADVICE, SWITCHES,
                                                TURNS, dial_vpn, drop_vpn, mms_works,
                                                network_search, on_off, set_permission, sim_status,
                                                speed, status_bar, turn, wifi_off, with_bar)


# ---- tools --------------------------------------------------------------------------------------

def check_status_bar(st: TelecomState, a: dict) -> str:
    return status_bar(st)


def check_network_status(st: TelecomState, a: dict) -> str:
    d = st.device
    lines = [f"Airplane Mode: {on_off(d['airplane_mode'])}", f"SIM Card Status: {sim_status(st)}",
             f"Cellular Connection: {d['network_connection_status']}",
             f"Cellular Signal: {d['network_signal_strength']}",
             f"Cellular Network Type: {d['network_technology_connected']}",
             f"Mobile Data Enabled: {'Yes' if d['data_enabled'] else 'No'}",
             f"Data Roaming Enabled: {'Yes' if d['roaming_enabled'] else 'No'}",
             f"Wi-Fi Radio: {on_off(d['wifi_enabled'])}",
             f"Wi-Fi Connected: {'Yes' if d['wifi_connected'] else 'No'}"]
    if d["wifi_connected"]:
        lines.append(f"Connected Wi-Fi Network: {d['wifi_ssid']}")
    return "\n".join(lines)


def check_network_mode_preference(st: TelecomState, a: dict) -> str:
    return f"Network Mode Preference: {st.device['network_mode_preference']}"


def set_network_mode_preference(st: TelecomState, a: dict) -> str:
    if a["mode"] not in MODES:  # the phone answers; nothing raises
        return with_bar(st, f"Failed to set network mode: {a['mode']!r} is not a valid option; "
                             f"choose one of {', '.join(MODES)}")
    st.device["network_mode_preference"] = a["mode"]
    network_search(st)
    return with_bar(st, f"Preferred Network Mode set to: {a['mode']}")


def run_speed_test(st: TelecomState, a: dict) -> str:
    mbps, desc = speed(st)
    if mbps is None:
        return f"Speed test failed: {desc}."
    return f"Speed Test Result: {mbps:.2f} Mbps ({desc}). {SPEED_ADVICE[desc]}"


def check_sim_status(st: TelecomState, a: dict) -> str:
    return {"active": "The SIM card is active and working.",
            "missing": "No SIM card is detected in the phone.",
            "locked_pin": "The SIM card is locked with a PIN code.",
            "locked_puk": "The SIM card is locked with a PUK code."}[sim_status(st)]


def reseat_sim_card(st: TelecomState, a: dict) -> str:
    st.device["sim_card_missing"] = False
    network_search(st)
    return with_bar(st, "SIM card re-seated successfully.")


def check_data_restriction_status(st: TelecomState, a: dict) -> str:
    return f"Data Saver mode is {on_off(st.device['data_saver_mode'])}."


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
    return with_bar(st, f"APN settings set to: {apn['apn_name']}")


def reset_apn_settings(st: TelecomState, a: dict) -> str:
    st.device["active_apn_settings"]["reset_at_reboot"] = True
    network_search(st)
    return with_bar(st, "APN settings will reset at reboot.")


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
        return with_bar(st, "Wi-Fi cannot be changed while Airplane Mode is ON.")
    d["wifi_enabled"] = not d["wifi_enabled"]
    if not d["wifi_enabled"]:
        wifi_off(d)
    return with_bar(st, f"Wi-Fi is now {on_off(d['wifi_enabled'])}.")


def check_wifi_calling_status(st: TelecomState, a: dict) -> str:
    return f"Wi-Fi Calling is {on_off(st.device['wifi_calling_enabled'])}."


def check_vpn_status(st: TelecomState, a: dict) -> str:
    d = st.device
    if d["vpn_connected"]:
        return f"VPN is ON and connected. Details: {d['vpn_details']}"
    if d["vpn_enabled_setting"]:
        return "VPN is ON in settings but not connected."
    return "VPN is OFF."


def connect_vpn(st: TelecomState, a: dict) -> str:
    if not dial_vpn(st.device):
        return "VPN already connected."
    return with_bar(st, "VPN connected successfully.")


def disconnect_vpn(st: TelecomState, a: dict) -> str:
    done = drop_vpn(st.device)
    return with_bar(st, "VPN disconnected successfully." if done
                     else "No active VPN connection to disconnect.")


def check_installed_apps(st: TelecomState, a: dict) -> str:
    return f"Installed apps: {', '.join(st.device['app_statuses'])}"


def _about_app(st: TelecomState, name: str, show: Callable[[list[str]], str]) -> str:
    """`show(granted permissions)`, or that the app is not installed."""
    app = st.device["app_statuses"].get(name)
    if app is None:
        return f"App '{name}' is not installed on this phone."
    return show([p for p, ok in app["permissions"].items() if ok])


def check_app_status(st: TelecomState, a: dict) -> str:
    return _about_app(st, a["app_name"], lambda granted: (
        f"Status for App: {a['app_name']}\n - Permissions granted: {', '.join(granted) or 'none'}"))


def check_app_permissions(st: TelecomState, a: dict) -> str:
    return _about_app(st, a["app_name"], lambda granted: (
        f"App '{a['app_name']}' has permission for: {', '.join(granted)}." if granted
        else f"App '{a['app_name']}' has no permissions granted."))


def grant_app_permission(st: TelecomState, a: dict) -> str:
    ok, msg = set_permission(st, a["app_name"], a["permission"], True)
    return with_bar(st, f"{'Success' if ok else 'Error'}. {msg}")


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
    return with_bar(st, "\n".join(lines))


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


_NONE = obj({})
_APP = s("App name, e.g. messaging or browser")
_PERM = s("Permission, e.g. sms, storage, phone or network")
_BOOL = {"type": "boolean"}


def _e(fn, parameters: dict = _NONE) -> DomainFunction:
    return _f(fn, "env", (fn.__doc__ or fn.__name__.replace("_", " ")).strip(), parameters)


def _a(fn, parameters: dict) -> DomainFunction:
    return _f(fn, "assert", "", parameters)


def _toggle(switch: str, description: str) -> DomainFunction:
    """The user's toggle_<switch> tool: flip it; the phone's answer and its status bar."""
    sw = SWITCHES[switch]
    return DomainFunction(
        name=f"toggle_{switch}", description=description, parameters=_NONE, kind="write",
        fn=lambda st, a: with_bar(st, f"{sw.label} is now {on_off(sw.flip(st))}."))


def _turn(switch: str, want: bool) -> DomainFunction:
    name = f"turn_{switch}_{on_off(want).lower()}"
    return DomainFunction(name=name, description=name.replace("_", " "), parameters=_NONE,
                          kind="env", fn=lambda st, a: turn(st, switch, want))


FUNCTIONS: tuple[DomainFunction, ...] = (
    _f(check_status_bar, "read", "What the phone's status bar shows: signal, network type, "
       "data, Wi-Fi, VPN, airplane mode, battery."),
    _f(check_network_status, "read", "The phone's detailed network status: airplane mode, SIM, "
       "cellular connection, signal, network type, mobile data, roaming, Wi-Fi."),
    _f(check_network_mode_preference, "read", "The preferred network mode (e.g. 4g_5g_preferred)."),
    _f(set_network_mode_preference, "write", "Set the preferred network mode.",
       obj({"mode": s("One of " + ", ".join(MODES))})),
    _f(run_speed_test, "read", "Measure the mobile data speed."),
    _toggle("airplane_mode", "Switch airplane mode on or off."),
    _f(check_sim_status, "read", "Whether the SIM card is active, missing or locked."),
    _f(reseat_sim_card, "write", "Take the SIM card out and put it back in."),
    _toggle("data", "Switch mobile data on or off."),
    _toggle("roaming", "Switch data roaming on or off."),
    _f(check_data_restriction_status, "read", "Whether Data Saver mode is on."),
    _toggle("data_saver_mode", "Switch Data Saver mode on or off."),
    _f(check_apn_settings, "read", "The phone's APN (access point) settings."),
    _f(set_apn_settings, "write", "Replace the APN settings.",
       obj({"apn_settings": {"type": "object", "description": "Fields: apn_name (internet or "
                             "broken), reset_at_reboot, mms_apn, mmsc_url, mms_proxy, mms_port"}})),
    _f(reset_apn_settings, "write", "Reset the APN settings to the defaults at the next reboot."),
    _f(check_wifi_status, "read", "Whether Wi-Fi is on and connected."),
    _f(toggle_wifi, "write", "Switch Wi-Fi on or off."),
    _f(check_wifi_calling_status, "read", "Whether Wi-Fi calling is on."),
    _toggle("wifi_calling", "Switch Wi-Fi calling on or off."),
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
    _e(phone.set_user_info, obj({"name": s("Name"), "phone_number": s("Phone number")})),
    _e(phone.set_user_location, obj({"abroad": _BOOL})),
    *(_e(fn) for fn in (phone.simulate_network_search, phone.unseat_sim_card, phone.turn_data_on,
                        phone.break_apn_settings, phone.break_apn_mms_setting, phone.break_vpn)),
    *(_turn(switch, want) for switch, want in TURNS),
    _e(phone.lock_sim_card, obj({"mode": s("", ["pin", "puk"])})),
    _e(phone.set_wifi_calling, obj({"enabled": _BOOL,
                                    "mms_over_wifi": {"type": ["boolean", "null"]}}, ["enabled"])),
    _e(phone.remove_app_permission, obj({"app_name": _APP, "permission": _PERM})),
    _a(phone.assert_airplane_mode_status, obj({"expected_status": _BOOL})),
    _a(phone.assert_service_status, obj({"expected_status": s("", NETWORK_STATUSES)})),
    _a(phone.assert_mobile_data_status, obj({"expected_status": _BOOL})),
    _a(phone.assert_mobile_roaming_status, obj({"expected_status": _BOOL})),
    _a(phone.assert_mobile_data_saver_mode_status, obj({"expected_status": _BOOL})),
    _a(phone.assert_internet_speed, obj({"expected_speed": {"type": "number"},
                                         "expected_desc": {"type": ["string", "null"]}},
                                        ["expected_speed"])),
    _a(phone.assert_internet_not_excellent, _NONE),
    _a(phone.assert_can_send_mms, obj({"expected_status": _BOOL})),
    _a(phone.assert_mobile_data_usage_exceeded, obj({"expected_status": _BOOL})),
)
