"""`python -m kindling.device_report`: what torch sees on this machine, and the trainer to use."""

from kindling.hardware import print_device_report

if __name__ == "__main__":
    print_device_report()
