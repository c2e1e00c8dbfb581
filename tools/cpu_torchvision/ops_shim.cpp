// Ops that torchvision 0.28's Python declares but 0.21's C++ sources lack
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace {

at::Tensor call_nms(const at::Tensor& dets, const at::Tensor& scores, double thr) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("torchvision::nms", "").typed<at::Tensor(const at::Tensor&, const at::Tensor&, double)>();
  return op.call(dets, scores, thr);
}

at::Tensor qnms_cpu(const at::Tensor& dets, const at::Tensor& scores, double iou_threshold) {
  return call_nms(dets.to(at::kFloat), scores.to(at::kFloat), iou_threshold);
}

at::Tensor qroi_align_cpu(const at::Tensor& input, const at::Tensor& rois, double input_scale, int64_t input_zero_point,
                          double rois_scale, int64_t rois_zero_point, double spatial_scale, c10::SymInt pooled_height,
                          c10::SymInt pooled_width, int64_t sampling_ratio, bool aligned) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("torchvision::roi_align", "").typed<at::Tensor(
      const at::Tensor&, const at::Tensor&, double, c10::SymInt, c10::SymInt, int64_t, bool)>();
  auto in = (input.to(at::kFloat) - static_cast<double>(input_zero_point)) * input_scale;
  auto r = (rois.to(at::kFloat) - static_cast<double>(rois_zero_point)) * rois_scale;
  auto out = op.call(in, r, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned);
  auto q = at::round(out / input_scale) + static_cast<double>(input_zero_point);
  double lo = 0, hi = 255;
  if (input.scalar_type() == at::kChar) { lo = -128; hi = 127; }
  else if (input.scalar_type() == at::kInt) { lo = -2147483648.0; hi = 2147483647.0; }
  return at::clamp(q, lo, hi).to(input.scalar_type());
}

at::Tensor box_iou_rotated_cpu(const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "torchvision::box_iou_rotated is not in this CPU build of torchvision (vllm-doctor tools/cpu_torchvision)");
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchvision, m) {
  m.def("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor");
  m.def("qroi_align(Tensor input, Tensor rois, float input_scale, int input_zero_point, float rois_scale, int rois_zero_point, float spatial_scale, SymInt pooled_height, SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor");
  m.def("box_iou_rotated(Tensor boxes1, Tensor boxes2) -> Tensor");
}

TORCH_LIBRARY_IMPL(torchvision, CPU, m) {
  m.impl("qnms", TORCH_FN(qnms_cpu));
  m.impl("qroi_align", TORCH_FN(qroi_align_cpu));
  m.impl("box_iou_rotated", TORCH_FN(box_iou_rotated_cpu));
}
