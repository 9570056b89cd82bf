// The GEMM measurements a training run chooses its kernels by and reports MFU against
// (kernels/cpu/gemm_peak.hpp), kept between runs in a cache file and agreed between ranks.
//
// Why a cache: measuring takes every rank about a second of start-up, and ranks that measure at
// the same time on shared cores see different figures, so without agreement two tensor-parallel
// ranks of a fast-mode run could choose different GEMMs. One JSON file holds an entry per machine
// key — the CPU model, the kernels' ISA, whether VDPBF16PS is there, the threads, OpenBLAS's kernel
// (OPENBLAS_CORETYPE moves it) and the ranks sharing the run — for the build that measured it (the
// executable's size and modification time): a rebuilt binary measures again, and the entries of
// other builds are dropped when the file is next written. The file is a convenience, never an
// input that can stop a run: an unreadable or malformed one is reported once and measured over.
// Not here: the measurement itself (gemm_peak.cpp) and the kernel choice it feeds (choose_gemms).
#pragma once

#include <optional>
#include <string>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/gemm_peak.hpp"

namespace lockstep::comm {
class Communicator;
}

namespace lockstep {

// `[train] kernel_cache` as a path: "auto" -> $XDG_CACHE_HOME/lockstep/kernels.json, else
// $HOME/.cache/lockstep/kernels.json ("" when neither is set); "off" -> "" (measure every start);
// anything else is the path itself.
std::string kernel_cache_path(const std::string& setting);

// What the figures depend on, one line: "AMD EPYC 9B45; avx512; avx512bf16; 2 threads; OpenBLAS
// Haswell; 4 ranks" (1 thread, 1 rank in the singular).
std::string kernel_cache_key(const CpuBackend& backend, int ranks);

// The running executable's identity: "<bytes>-<modification time in ns>" of /proc/self/exe.
std::string build_identity();

struct CachedPeak {
  GemmPeak peak;
  std::string measured_at;  // UTC, ISO 8601
};

// The entry of `key` measured by `build`, if the file has one. A missing file is no entry; a file
// that cannot be read or parsed is no entry too, with the reason in *problem (naming the path).
std::optional<CachedPeak> read_kernel_cache(const std::string& path, const std::string& key,
                                            const std::string& build, std::string* problem);

// Records `peak` as the entry of `key` for `build`, keeping the file's other entries of that build
// and dropping those of other builds; written atomically (the directory made if missing). Returns
// the reason when the file could not be written, "" on success.
std::string write_kernel_cache(const std::string& path, const std::string& key, const std::string& build,
                               const GemmPeak& peak);

// The GEMM peak every rank of `world` chooses its kernels by: rank 0's cached entry where it has
// one; otherwise every rank measures (each under the load of the others, as the run will be) and
// the ranks take the highest figure of each candidate, which rank 0 then caches. Every rank ends
// with the same figures, hence the same kernels. *note (rank 0's) says where the figures came from
// and any problem with the cache file.
GemmPeak agreed_gemm_peak(const CpuBackend& backend, const std::string& cache_path, comm::Communicator& world,
                          std::string* note);

}  // namespace lockstep
