"""`python -m kindling.device_report`: what torch sees on this machine, and the trainer to use."""

from rich.console import Console

from kindling.hardware import DeviceInfo, collect_device_info, device_table


def print_device_report(console: Console | None = None) -> DeviceInfo:
    info = collect_device_info()
    (console or Console()).print(device_table(info))
    return info


if __name__ == "__main__":
    print_device_report()
