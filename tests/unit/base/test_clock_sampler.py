# The GPU clock beside each speed figure: telemetry.ClockSampler's sampling and summary (through a stand-in for
# NVML, which this machine lacks: the GPU machine's runs exercise the real one) and the docs' sentence on it.
import statistics
import time

import pytest

from ghostedit import telemetry
from lab.docs import render as docs

IDLE, POWER_CAP, THERMAL = 0x1, 0x4, 0x20


class StandInNvml:
    """The NVML calls ClockSampler makes, answering from a cycle of (clock, milliwatts, degrees, reasons) readings
    and logging what it answered."""
    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0
    nvmlClocksEventReasonGpuIdle, nvmlClocksEventReasonSwPowerCap = IDLE, POWER_CAP
    nvmlClocksEventReasonSwThermalSlowdown, nvmlClocksEventReasonHwThermalSlowdown = THERMAL, 0x40
    nvmlClocksEventReasonHwSlowdown = 0x8
    READINGS = ((1980, 400_000, 50, 0), (1850, 700_000, 60, POWER_CAP), (345, 70_000, 40, IDLE),
                (1800, 690_000, 66, POWER_CAP | THERMAL))

    def __init__(self):
        self.answered = []

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("gpu", index)

    def nvmlDeviceGetClockInfo(self, handle, clock):
        reading = self.READINGS[len(self.answered) % len(self.READINGS)]
        self.answered.append(reading)
        return reading[0]

    def nvmlDeviceGetPowerUsage(self, handle):
        return self.answered[-1][1]

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return self.answered[-1][2]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.answered[-1][3]

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):
        return 1980


def test_the_summary_covers_the_busy_samples_only(monkeypatch):
    nvml = StandInNvml()
    monkeypatch.setattr(telemetry, "nvml_module", lambda: nvml)
    with telemetry.ClockSampler("cuda:0", interval_s=0.001) as sampler:
        time.sleep(0.1)
    summary = sampler.summary()
    busy = [reading for reading in nvml.answered if not reading[3] & IDLE]
    assert len(busy) < len(nvml.answered) and summary["samples"] == len(busy)
    assert summary["sm_clock_mhz"] == statistics.median(clock for clock, *_ in busy)
    assert summary["sm_clock_lowest_mhz"] == 1800 and summary["sm_clock_max_mhz"] == 1980
    assert summary["power_w"] == statistics.median(milliwatts / 1000 for _, milliwatts, *_ in busy)
    assert summary["power_capped_share"] == sum(1 for *_, reasons in busy if reasons & POWER_CAP) / len(busy)
    assert summary["thermal_share"] == sum(1 for *_, reasons in busy if reasons & THERMAL) / len(busy)
    assert summary["temperature_c_highest"] == 66
    count = len(nvml.answered)
    time.sleep(0.02)
    assert len(nvml.answered) == count  # the thread stopped with the block


def test_no_gpu_no_sampling_and_no_summary():
    with telemetry.ClockSampler("cpu") as sampler:
        time.sleep(0.01)
    assert sampler.summary() is None


def test_the_docs_say_the_clock_the_rows_ran_at():
    clock = {"sm_clock_mhz": 1845.0, "sm_clock_lowest_mhz": 1755, "sm_clock_max_mhz": 1980, "power_w": 690.0,
             "temperature_c_highest": 64, "power_capped_share": 0.75, "thermal_share": 0.0, "samples": 40,
             "interval_s": 0.05}
    sentence = docs.clocks([{"gpu_clock": clock}, {"gpu_clock": {**clock, "sm_clock_mhz": 1920.0,
                                                                 "power_capped_share": 0.25}}])
    assert "medians of 1845-1920 MHz" in sentence and "highest 1980 MHz" in sentence
    assert "every 50 ms" in sentence and "25-75 percent" in sentence
    assert docs.clocks([{"gpu_clock": None}, {}]) == ""


def test_a_failing_nvml_call_warns_and_keeps_what_was_sampled(monkeypatch):
    class FailingNvml(StandInNvml):
        def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
            if len(self.answered) > 4:
                raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
            return super().nvmlDeviceGetCurrentClocksEventReasons(handle)

    nvml = FailingNvml()
    monkeypatch.setattr(telemetry, "nvml_module", lambda: nvml)
    with pytest.warns(UserWarning, match="stopped being sampled: RuntimeError: NVML_ERROR_GPU_IS_LOST"):
        with telemetry.ClockSampler("cuda:0", interval_s=0.001) as sampler:
            time.sleep(0.05)
    assert sampler.summary()["samples"] == 3  # the four readings before the failure, one of them idle
