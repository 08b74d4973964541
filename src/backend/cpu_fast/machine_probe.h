// machine_probe.h: what this machine's cores can do, measured, for `lily bench` on the CPU
// (as the GPU bench measures the device's copy bandwidth): the ceiling that decode tokens/s
// and prefill FLOP/s are stated against.
#pragma once

namespace lily::cpu_fast {

// Bytes per second cpu_team() reads from memory: each member streams its share of a buffer
// eight times the size of a typical L3 (256 MiB), the best of five passes.
double measure_read_bandwidth();

// fp32 multiply-adds per second x 2 that cpu_team() sustains on independent register chains
// (the widest vectors the processor has): the arithmetic ceiling of prefill.
double measure_fp32_flops();

}  // namespace lily::cpu_fast
