// compare_weights DIR REFERENCE.safetensors TOL [INITIAL.safetensors]
//
// Every tensor of REFERENCE must be in one of DIR's *.safetensors files (a
// directory shardkit exported: one file, or shards with an index), with the
// same shape and every element within TOL of the reference. With INITIAL
// (the weights before training), the reference must also differ from it by
// more than 100 TOL somewhere, so that a run that trained nothing fails.
// Prints the largest difference per tensor; exit status 0 when all hold.
#include <dirent.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "runtime/checkpoint/safetensors.h"

namespace {

bool Floats(const sk::SafeTensorsFile& f, const std::string& name, std::vector<float>* out, sk::Shape* shape) {
  auto info = f.info(name);
  if (!info.ok() || info->dtype != sk::DType::kF32) return false;
  auto data = f.data(name);
  if (!data.ok()) return false;
  const float* p = static_cast<const float*>(*data);
  out->assign(p, p + info->shape.numel());
  *shape = info->shape;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: %s DIR REFERENCE.safetensors TOL [INITIAL.safetensors]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const double tol = std::atof(argv[3]);
  std::vector<sk::SafeTensorsFile> files;
  std::map<std::string, size_t> where;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    std::fprintf(stderr, "FAIL: cannot open directory %s\n", dir.c_str());
    return 1;
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0) names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    auto f = sk::SafeTensorsFile::Read(dir + "/" + n);
    if (!f.ok()) {
      std::fprintf(stderr, "FAIL: %s\n", f.status().ToString().c_str());
      return 1;
    }
    for (const std::string& t : f->names()) where[t] = files.size();
    files.push_back(std::move(*f));
  }
  auto ref = sk::SafeTensorsFile::Read(argv[2]);
  if (!ref.ok()) {
    std::fprintf(stderr, "FAIL: %s\n", ref.status().ToString().c_str());
    return 1;
  }
  std::vector<sk::SafeTensorsFile> initial;
  if (argc == 5) {
    auto f = sk::SafeTensorsFile::Read(argv[4]);
    if (!f.ok()) {
      std::fprintf(stderr, "FAIL: %s\n", f.status().ToString().c_str());
      return 1;
    }
    initial.push_back(std::move(*f));
  }
  bool ok = true;
  double worst = 0, moved = 0;
  for (const std::string& name : ref->names()) {
    std::vector<float> want, got, init;
    sk::Shape want_shape, got_shape, init_shape;
    if (!Floats(*ref, name, &want, &want_shape)) {
      std::fprintf(stderr, "FAIL: reference tensor %s is not f32\n", name.c_str());
      ok = false;
      continue;
    }
    auto it = where.find(name);
    if (it == where.end() || !Floats(files[it->second], name, &got, &got_shape) || !(got_shape == want_shape)) {
      std::fprintf(stderr, "FAIL: %s is missing from %s, not f32 or of another shape\n", name.c_str(), dir.c_str());
      ok = false;
      continue;
    }
    double diff = 0;
    for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, std::fabs(double(got[i]) - double(want[i])));
    if (!initial.empty() && Floats(initial[0], name, &init, &init_shape) && init_shape == want_shape) {
      for (size_t i = 0; i < want.size(); ++i) moved = std::max(moved, std::fabs(double(init[i]) - double(want[i])));
    }
    std::printf("%-48s max |diff| %.3g\n", name.c_str(), diff);
    worst = std::max(worst, diff);
    if (!(diff <= tol)) ok = false;
  }
  std::printf("largest difference %.3g (tolerance %.3g)\n", worst, tol);
  if (!initial.empty()) {
    std::printf("training moved a weight by %.3g\n", moved);
    if (!(moved > 100 * tol)) {
      std::fprintf(stderr, "FAIL: the reference is within 100 x tolerance of the initial weights\n");
      ok = false;
    }
  }
  if (!ok) std::fprintf(stderr, "FAIL: weights differ from the reference\n");
  return ok ? 0 : 1;
}
