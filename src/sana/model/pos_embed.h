// The fixed 2-D sin-cos position embedding of model.use_pe, computed as upstream's
// get_2d_sincos_pos_embed (diffusion/model/nets/sana_blocks.py, from PixArt) does it for each
// bucket's token grid, so a multi-scale run embeds every aspect ratio consistently.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace sana::model {

// [h*w, dim] float32 for an h x w grid (row-major tokens). The first dim/2 channels encode the
// column and the rest the row, each as [sin(p w_k) for k, cos(p w_k) for k], w_k =
// 10000^(-k / (dim/4)), p = index / (size / base_size) / pe_interpolation in float32 as
// numpy computes it, the products in float64. dim must be a multiple of 4.
torch::Tensor sincos_pos_embed(int64_t dim, int64_t h, int64_t w, double pe_interpolation, int64_t base_size);

}  // namespace sana::model
