// The eager hot path of the ops in one C++ call: find the plan the Python path recorded for this
// call signature, allocate the outputs, launch. A call whose signature has no plan, or whose
// per-call checks (row count, alignment) fail, returns None and the Python path runs: it checks
// everything, raises the errors that name the argument, and records a plan for next time.
// A call's outputs come out of one allocation (see allocate). Each launch runs with its
// tensors' device current (OnDevice).
//
// Signature of a tensor: dtype, device, sizes (the row count of a 2-D operand as 0, 1 or more
// where the plan does not depend on it; a weight's length exactly) and strides: what the Python
// checks read. Plans are keyed by the op, an id of
// its other parameters (from Python) and the signatures of its tensors.
#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

using Key = std::vector<int64_t>;
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ uint64_t(v)) * 1099511628211ull;
    return h;
  }
};

enum Op : int64_t { kQuant = 1, kNorm, kNormQuant, kGemm, kDual };
enum Layout : int64_t { kRow = 0, kCol, kColTma };

constexpr int64_t kMaxRows = (int64_t(1) << 31) - 1;

struct Plan {
  void* fn = nullptr;
  std::string uri;
  at::ScalarType out_dtype = at::kFloat;  // fp8 (quant ops) or bf16 (gemm)
  int64_t groups = 0, layout = kRow, grid_waves = 0;
  float eps = 0.0f;
  int64_t gemm_args[9] = {};  // the launcher's integers: m, n, k, then strides
};

std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans;

// Appends t's signature; false if o is not a tensor. rows_open: 2-D tensors by 0, 1 or more rows.
bool sign(Key& key, PyObject* o, bool rows_open) {
  if (!THPVariable_Check(o)) return false;
  const at::Tensor& t = THPVariable_Unpack(o);
  key.push_back(int64_t(t.scalar_type()));
  key.push_back(int64_t(t.device().type()));
  key.push_back(t.device().index());
  key.push_back(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t s = t.size(d);
    key.push_back(d == 0 && rows_open && t.dim() == 2 ? (s < 2 ? s : 2) : s);
    key.push_back(t.stride(d));
  }
  return true;
}

// The call's key: op, parameter id, then each tensor's signature (None: a marker). Empty if an
// argument is neither a tensor nor None.
Key make_key(Op op, PyObject* param_id, PyObject* const* tensors, int n, bool rows_open) {
  Key key{op, PyLong_AsLongLong(param_id)};
  for (int i = 0; i < n; ++i) {
    if (tensors[i] == Py_None) {
      key.push_back(-1);
    } else if (!sign(key, tensors[i], rows_open)) {
      return {};
    }
  }
  return key;
}

const Plan* find(const Key& key) {
  if (key.empty()) return nullptr;
  auto it = plans.find(key);
  return it == plans.end() ? nullptr : it->second.get();
}

const at::Tensor& tensor(PyObject* o) { return THPVariable_Unpack(o); }
void* ptr(const at::Tensor& t) { return const_cast<void*>(t.data_ptr()); }

// torch's current raw stream of a device (torch._C._cuda_getCurrentRawStream, set by Python).
PyObject* raw_stream = nullptr;

void* stream(const at::Tensor& t) {
  if (!t.is_cuda() || raw_stream == nullptr) return nullptr;
  PyObject* index = PyLong_FromLong(t.device().index());
  PyObject* s = PyObject_CallOneArg(raw_stream, index);
  Py_DECREF(index);
  if (s == nullptr) {
    PyErr_Clear();
    throw std::runtime_error("fastcall: torch could not give the current stream");
  }
  void* out = PyLong_AsVoidPtr(s);
  Py_DECREF(s);
  return out;
}

// The launch's device made current where it is not, and the one before it again after (a
// launch goes to the current device, whatever its pointers; torch's ops guard the same way).
struct OnDevice {
  c10::OptionalDeviceGuard guard;
  explicit OnDevice(const at::Device& d) {
    if (d.is_cuda() && c10::impl::getDeviceGuardImpl(d.type())->getDevice() != d) {
      guard.reset_device(d);
    }
  }
};

bool aligned(const at::Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16) return false;
  return t.dim() == 1 || t.size(0) <= 1 || (t.stride(0) * t.element_size()) % 16 == 0;
}

int64_t row_stride_bytes(const at::Tensor& t) {
  return (t.size(0) > 1 ? t.stride(0) : t.size(1)) * t.element_size();
}

// An output of a call: its sizes, strides, dtype and the elements its allocation holds.
struct Out {
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
  int64_t elems;
};

// (strides as torch gives an empty tensor of these sizes: a zero size counts as one)
Out contiguous(int64_t t, int64_t h, at::ScalarType dtype) {
  return {{t, h}, {std::max<int64_t>(h, 1), 1}, dtype, t * h};
}

// fp32 scales [t, groups] in the layout's strides (as ops/quant.py's empty_scales).
Out scales(int64_t t, const Plan& p) {
  if (p.layout == kRow) return contiguous(t, p.groups, at::kFloat);
  const int64_t stride = p.layout == kCol ? t : (t + 3) / 4 * 4;
  return {{t, p.groups}, {1, std::max<int64_t>(stride, 1)}, at::kFloat, p.groups * stride};
}

// The call's outputs, carved 256-byte aligned out of one allocation on like's device: one trip
// through the allocator instead of one per output (an eager call's largest host cost after the
// launch). They share that storage, which lives until the last of them is freed.
std::vector<at::Tensor> allocate(const at::Tensor& like, std::initializer_list<Out> outs) {
  std::vector<int64_t> at_byte;
  int64_t bytes = 0;
  for (const Out& o : outs) {
    bytes = (bytes + 255) / 256 * 256;
    at_byte.push_back(bytes);
    bytes += o.elems * int64_t(c10::elementSize(o.dtype));
  }
  const at::Tensor buf = at::empty({bytes}, like.options().dtype(at::kByte));
  std::vector<at::Tensor> tensors;
  size_t i = 0;
  for (const Out& o : outs) {
    at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(buf.storage()), buf.key_set(), c10::scalarTypeToTypeMeta(o.dtype));
    t.unsafeGetTensorImpl()->set_sizes_and_strides(
        o.sizes, o.strides, at_byte[i++] / int64_t(c10::elementSize(o.dtype)));
    tensors.push_back(std::move(t));
  }
  return tensors;
}

// C++ exceptions (an allocation that fails, a device error) become Python errors.
#define GUARDED(...)                                    \
  try {                                                 \
    __VA_ARGS__                                         \
  } catch (const std::exception& e) {                   \
    PyErr_SetString(PyExc_RuntimeError, e.what());      \
    return nullptr;                                     \
  }

PyObject* launch_failed(const Plan& p, int rc) {
  PyErr_Format(PyExc_RuntimeError, "%s: kernel launch failed with GPU runtime error %d",
               p.uri.c_str(), rc);
  return nullptr;
}

PyObject* pair(at::Tensor a, at::Tensor b) {
  PyObject* out = PyTuple_New(2);
  PyTuple_SET_ITEM(out, 0, THPVariable_Wrap(std::move(a)));
  PyTuple_SET_ITEM(out, 1, THPVariable_Wrap(std::move(b)));
  return out;
}

using QuantFn = int (*)(const void*, void*, void*, int64_t, int64_t, int64_t, int64_t, int64_t,
                        void*);
using NormFn = int (*)(const void*, const void*, void*, const void*, void*, int64_t, int64_t,
                       int64_t, int64_t, int64_t, float, void*);
using NormQuantFn = int (*)(const void*, const void*, void*, const void*, void*, void*, void*,
                            int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float,
                            void*);

// An optional [t, h] residual operand: present, t rows, 16-byte aligned rows (or None).
bool residual_ok(PyObject* o, int64_t t) {
  return o == Py_None || (tensor(o).size(0) == t && aligned(tensor(o)));
}

// Whether two [t, h] / [h] operands share a byte (as ops/_common.py's overlap): exact for rows
// of one stride, by the spans they cover otherwise.
bool overlap(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  struct Rows { int64_t p, rows, stride, width; };
  auto rows_of = [](const at::Tensor& t) {
    const int64_t es = t.element_size(), p = reinterpret_cast<intptr_t>(t.data_ptr());
    if (t.dim() == 1) return Rows{p, 1, 0, ((t.size(0) - 1) * t.stride(0) + 1) * es};
    return Rows{p, t.size(0), t.stride(0) * es, ((t.size(1) - 1) * t.stride(1) + 1) * es};
  };
  const Rows A = rows_of(a), B = rows_of(b);
  if (A.p + (A.rows - 1) * A.stride + A.width <= B.p ||
      B.p + (B.rows - 1) * B.stride + B.width <= A.p) {
    return false;
  }
  const int64_t s = A.rows == 1 ? B.stride : A.stride;  // a single row has no stride of its own
  if ((B.rows > 1 && B.stride != s) || s <= 0) return true;
  // row i of a and row j of b meet where d - A.width < (i - j) * s < d + B.width
  const int64_t d = B.p - A.p, num = d - A.width;
  const int64_t k = std::max(num / s - (num % s < 0 ? 1 : 0) + 1, 1 - B.rows);
  return k <= A.rows - 1 && k * s < d + B.width;
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.data_ptr() == b.data_ptr() && a.strides() == b.strides() && a.sizes() == b.sizes();
}

// What the kernels write shares no memory with the other operands (as the Python path's
// check_written, which raises where this declines): out (where given) is x itself or apart from
// x, w and the residuals; the residual sum goes into residual_out (residual itself or apart from
// it), else into residual, apart from x and w either way.
bool written_apart(const at::Tensor& x, const at::Tensor& w, PyObject* res, PyObject* res_out,
                   const at::Tensor* out) {
  const at::Tensor* r = res == Py_None ? nullptr : &tensor(res);
  const at::Tensor* ro = res_out == Py_None ? nullptr : &tensor(res_out);
  if (out != nullptr && ((!same(*out, x) && overlap(*out, x)) || overlap(*out, w) ||
                         (r && overlap(*out, *r)) || (ro && overlap(*out, *ro)))) {
    return false;
  }
  if (r == nullptr) return true;
  const at::Tensor& sum = ro ? *ro : *r;
  if (ro && !same(*ro, *r) && overlap(*ro, *r)) return false;
  return !overlap(sum, x) && !overlap(sum, w);
}
void* optional_ptr(PyObject* o) { return o == Py_None ? nullptr : ptr(tensor(o)); }
int64_t optional_stride(PyObject* o) { return o == Py_None ? 0 : row_stride_bytes(tensor(o)); }
using GemmFn = int (*)(const void*, const void*, const void*, const void*, void*, int64_t,
                       int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       void*);

// quant(param_id, x, out or None) -> (q, scales) or None. out: written instead of a new q
// (x's shape and device, the plan's FP8 dtype, contiguous, 16-byte aligned).
PyObject* quant(PyObject*, PyObject* const* a, Py_ssize_t n) {
  GUARDED(
  if (n != 3) return PyErr_Format(PyExc_TypeError, "quant: 3 arguments");
  const Plan* p = find(make_key(kQuant, a[0], a + 1, 1, true));
  if (p == nullptr) Py_RETURN_NONE;
  const at::Tensor& x = tensor(a[1]);
  if (x.numel() && !aligned(x)) Py_RETURN_NONE;   // the Python path copies it first
  const int64_t t = x.size(0), h = x.size(1);
  at::Tensor q, s;
  if (a[2] == Py_None) {
    auto outs = allocate(x, {contiguous(t, h, p->out_dtype), scales(t, *p)});
    q = std::move(outs[0]), s = std::move(outs[1]);
  } else {
    if (!THPVariable_Check(a[2])) Py_RETURN_NONE;
    q = tensor(a[2]);
    if (q.sizes() != x.sizes() || q.scalar_type() != p->out_dtype || q.device() != x.device() ||
        !q.is_contiguous() || reinterpret_cast<uintptr_t>(q.data_ptr()) % 16 || overlap(q, x)) {
      Py_RETURN_NONE;   // the Python path says what is wrong
    }
    s = std::move(allocate(x, {scales(t, *p)})[0]);
  }
  if (t > 0) {
    const OnDevice current(x.device());
    const int64_t col = p->layout == kCol ? t : (t + 3) / 4 * 4;
    const int rc = reinterpret_cast<QuantFn>(p->fn)(
        x.data_ptr(), ptr(q), ptr(s), t * p->groups, p->groups, x.stride(0) * x.element_size(),
        col, p->grid_waves, stream(x));
    if (rc) return launch_failed(*p, rc);
  }
  return pair(std::move(q), std::move(s));
  )
}

// norm(param_id, x, residual or None, weight, residual_out or None, out or None) -> y or None:
// rmsnorm / fused_add_rmsnorm with 16-byte loads (the plan's kernel); other alignments take the
// Python path. out: written instead of a new y (contiguous, x's shape, dtype and device; may be
// x).
PyObject* norm(PyObject*, PyObject* const* a, Py_ssize_t n) {
  GUARDED(
  if (n != 6) return PyErr_Format(PyExc_TypeError, "norm: 6 arguments");
  const Plan* p = find(make_key(kNorm, a[0], a + 1, 4, true));
  if (p == nullptr) Py_RETURN_NONE;
  const at::Tensor& x = tensor(a[1]);
  const at::Tensor& w = tensor(a[3]);
  const int64_t t = x.size(0), h = x.size(1);
  if (t > kMaxRows || !aligned(x) || !aligned(w) || !residual_ok(a[2], t) ||
      !residual_ok(a[4], t)) {
    Py_RETURN_NONE;
  }
  at::Tensor y;
  if (a[5] == Py_None) {
    if (!written_apart(x, w, a[2], a[4], nullptr)) Py_RETURN_NONE;
    y = at::empty({t, h}, x.options());
  } else {
    if (!THPVariable_Check(a[5])) Py_RETURN_NONE;
    y = tensor(a[5]);
    if (y.sizes() != x.sizes() || y.scalar_type() != x.scalar_type() ||
        y.device() != x.device() || !y.is_contiguous() || !aligned(y) ||
        !written_apart(x, w, a[2], a[4], &y)) {
      Py_RETURN_NONE;
    }
  }
  if (t > 0) {
    const OnDevice current(x.device());
    const int rc = reinterpret_cast<NormFn>(p->fn)(
        x.data_ptr(), optional_ptr(a[2]), optional_ptr(a[4]), w.data_ptr(), ptr(y), t, h,
        row_stride_bytes(x), optional_stride(a[2]), optional_stride(a[4]), p->eps, stream(x));
    if (rc) return launch_failed(*p, rc);
  }
  return THPVariable_Wrap(std::move(y));
  )
}

// norm_quant(param_id, x, weight, residual or None, residual_out or None) -> (q, scales) or
// None: rmsnorm_group_quant with aligned rows (no copies) and no unquantized output.
PyObject* norm_quant(PyObject*, PyObject* const* a, Py_ssize_t n) {
  GUARDED(
  if (n != 5) return PyErr_Format(PyExc_TypeError, "norm_quant: 5 arguments");
  const Plan* p = find(make_key(kNormQuant, a[0], a + 1, 4, true));
  if (p == nullptr) Py_RETURN_NONE;
  const at::Tensor& x = tensor(a[1]);
  const at::Tensor& w = tensor(a[2]);
  const int64_t t = x.size(0), h = x.size(1);
  if (t > kMaxRows || !aligned(x) || !aligned(w) || !residual_ok(a[3], t) ||
      !residual_ok(a[4], t) || !written_apart(x, w, a[3], a[4], nullptr)) {
    Py_RETURN_NONE;
  }
  auto outs = allocate(x, {contiguous(t, h, p->out_dtype), scales(t, *p)});
  at::Tensor &q = outs[0], &s = outs[1];
  if (t > 0) {
    const OnDevice current(x.device());
    const int rc = reinterpret_cast<NormQuantFn>(p->fn)(
        x.data_ptr(), optional_ptr(a[3]), optional_ptr(a[4]), w.data_ptr(), ptr(q), ptr(s),
        nullptr, t, h, row_stride_bytes(x), optional_stride(a[3]), optional_stride(a[4]),
        s.stride(0), s.stride(1), p->eps, stream(x));
    if (rc) return launch_failed(*p, rc);
  }
  return pair(std::move(q), std::move(s));
  )
}

using DualFn = int (*)(const void*, const void*, void*, void*, const void*, const void*, void*,
                       int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float,
                       void*);

// dual(param_id, q, q_weight, kv, kv_weight) -> (q_fp8, q_scales, kv_out) or None
PyObject* dual(PyObject*, PyObject* const* a, Py_ssize_t n) {
  GUARDED(
  if (n != 5) return PyErr_Format(PyExc_TypeError, "dual: 5 arguments");
  const Plan* p = find(make_key(kDual, a[0], a + 1, 4, true));
  if (p == nullptr) Py_RETURN_NONE;
  const at::Tensor &q = tensor(a[1]), &qw = tensor(a[2]), &kv = tensor(a[3]),
                   &kw = tensor(a[4]);
  const int64_t t = q.size(0), hq = q.size(1), hkv = kv.size(1);
  if (t > kMaxRows || kv.size(0) != t || !aligned(q) || !aligned(qw) || !aligned(kv) ||
      !aligned(kw)) {
    Py_RETURN_NONE;
  }
  auto outs = allocate(q, {contiguous(t, hq, p->out_dtype), scales(t, *p),
                           contiguous(t, hkv, kv.scalar_type())});
  at::Tensor &q8 = outs[0], &s = outs[1], &kv_out = outs[2];
  if (t > 0) {
    const OnDevice current(q.device());
    const int rc = reinterpret_cast<DualFn>(p->fn)(
        q.data_ptr(), qw.data_ptr(), ptr(q8), ptr(s), kv.data_ptr(), kw.data_ptr(), ptr(kv_out),
        t, hq, hkv, row_stride_bytes(q), row_stride_bytes(kv), s.stride(0), s.stride(1),
        p->eps, stream(q));
    if (rc) return launch_failed(*p, rc);
  }
  PyObject* out = PyTuple_New(3);
  PyTuple_SET_ITEM(out, 0, THPVariable_Wrap(std::move(q8)));
  PyTuple_SET_ITEM(out, 1, THPVariable_Wrap(std::move(s)));
  PyTuple_SET_ITEM(out, 2, THPVariable_Wrap(std::move(kv_out)));
  return out;
  )
}

// gemm(param_id, a, a_scales, b, b_scales) -> out or None
PyObject* gemm(PyObject*, PyObject* const* a, Py_ssize_t n) {
  GUARDED(
  if (n != 5) return PyErr_Format(PyExc_TypeError, "gemm: 5 arguments");
  const Plan* p = find(make_key(kGemm, a[0], a + 1, 4, false));
  if (p == nullptr) Py_RETURN_NONE;
  const at::Tensor &A = tensor(a[1]), &B = tensor(a[3]);
  if (reinterpret_cast<uintptr_t>(A.data_ptr()) % 16 ||
      reinterpret_cast<uintptr_t>(B.data_ptr()) % 16) {
    Py_RETURN_NONE;
  }
  const int64_t* g = p->gemm_args;
  at::Tensor out = at::empty({g[0], g[1]}, A.options().dtype(p->out_dtype));
  if (g[0] > 0 && g[1] > 0) {
    const OnDevice current(A.device());
    const int rc = reinterpret_cast<GemmFn>(p->fn)(
        A.data_ptr(), B.data_ptr(), tensor(a[2]).data_ptr(), tensor(a[4]).data_ptr(), ptr(out),
        g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], stream(A));
    if (rc) return launch_failed(*p, rc);
  }
  return THPVariable_Wrap(std::move(out));
  )
}

// record(op, param_id, tensors, fn, uri, out_dtype, ints, eps): the plan for the signature of
// tensors (a tuple of tensors / None), as the Python path checked and launched it. ints: groups,
// layout, grid_waves (quant ops), or the launcher's 9 integers (gemm).
PyObject* record(PyObject*, PyObject* const* a, Py_ssize_t n) {
  GUARDED(
  if (n != 8 || !PyTuple_Check(a[2]) || !PyTuple_Check(a[6]) || !THPDtype_Check(a[5])) {
    return PyErr_Format(PyExc_TypeError, "record: (op, param_id, tensors, fn, uri, dtype, ints, "
                                         "eps)");
  }
  const Op op = Op(PyLong_AsLongLong(a[0]));
  const int nt = int(PyTuple_GET_SIZE(a[2]));
  std::vector<PyObject*> ts(nt);
  for (int i = 0; i < nt; ++i) ts[i] = PyTuple_GET_ITEM(a[2], i);
  Key key = make_key(op, a[1], ts.data(), nt, op != kGemm);
  if (key.empty()) return PyErr_Format(PyExc_TypeError, "record: tensors or None");
  auto p = std::make_unique<Plan>();
  p->fn = PyLong_AsVoidPtr(a[3]);
  const char* uri = PyUnicode_AsUTF8(a[4]);
  if (uri == nullptr) return nullptr;
  p->uri = uri;
  p->out_dtype = reinterpret_cast<THPDtype*>(a[5])->scalar_type;
  const Py_ssize_t ni = PyTuple_GET_SIZE(a[6]);
  std::vector<int64_t> ints(ni);
  for (Py_ssize_t i = 0; i < ni; ++i) ints[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(a[6], i));
  if (op == kGemm) {
    if (ni != 9) return PyErr_Format(PyExc_ValueError, "record: gemm takes 9 integers");
    for (int i = 0; i < 9; ++i) p->gemm_args[i] = ints[i];
  } else if (ni == 3) {
    p->groups = ints[0], p->layout = ints[1], p->grid_waves = ints[2];
  }
  p->eps = float(PyFloat_AsDouble(a[7]));
  if (PyErr_Occurred()) return nullptr;
  plans[std::move(key)] = std::move(p);
  Py_RETURN_NONE;
  )
}

PyObject* set_stream_getter(PyObject*, PyObject* fn) {
  Py_XDECREF(raw_stream);
  Py_INCREF(fn);
  raw_stream = fn;
  Py_RETURN_NONE;
}

PyObject* clear(PyObject*, PyObject*) {
  plans.clear();
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"quant", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(quant)), METH_FASTCALL, ""},
    {"norm", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(norm)), METH_FASTCALL, ""},
    {"norm_quant", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(norm_quant)),
     METH_FASTCALL, ""},
    {"gemm", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(gemm)), METH_FASTCALL, ""},
    {"dual", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(dual)), METH_FASTCALL, ""},
    {"record", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(record)), METH_FASTCALL,
     ""},
    {"set_stream_getter", set_stream_getter, METH_O, ""},
    {"clear", clear, METH_NOARGS, ""},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "codegen_fastcall", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_codegen_fastcall() { return PyModule_Create(&module); }
