// SPDX-License-Identifier: Apache-2.0
// KILN_PARAMS_FN marks the functions of Params headers (shared-memory sizes and the like): they
// are compiled by the host compiler and by NVRTC/hipRTC, whose JIT mode refuses functions not
// marked for the device.
#pragma once

#ifndef KILN_PARAMS_FN
#if defined(__CUDACC__) || defined(__CUDACC_RTC__) || defined(__HIPCC__) || defined(__HIPCC_RTC__)
#define KILN_PARAMS_FN __host__ __device__
#else
#define KILN_PARAMS_FN
#endif
#endif
