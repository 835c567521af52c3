// The AMX tile configuration (the 64-byte operand of `ldtilecfg`, palette 1), shared by the
// tile kernels amx_bf16.cpp and qa8_amx.cpp. No intrinsics: any translation unit may include
// it. Layout after Intel's AMX programming reference (Optimization Reference Manual, ch. 20).
#pragma once
#include <cstdint>
#include <cstring>

namespace localchat_cpu {

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];  // bytes per row of each tile
  uint8_t rows[16];    // rows of each tile
};

// A configuration with every tile unused (rows = colsb = 0) on palette 1.
inline TileConfig tile_config() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  return cfg;
}

}  // namespace localchat_cpu
