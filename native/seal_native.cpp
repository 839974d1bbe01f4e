// secagg's native path over Microsoft SEAL 4.1: the loops a round spends its crypto time in,
// each in one call, in memory, with the GIL released and chunks spread over threads.
//
//  * SecretKeyCKKS.encrypt (a client's upload): encode N reals a chunk (two per complex slot,
//    as secagg's Python path does) and encrypt them with SEAL's seeded symmetric encryption,
//    written in SEAL's own uncompressed format (8 bytes a value, no zstd, no scratch file).
//  * SeedExpander.sum (a decryptor's check): per chunk, Σ k_i·a_i over the uploads of a
//    release, a_i the second polynomial SEAL expands from upload i's seed (what
//    Ciphertext::load does for a seeded ciphertext) and k_i its weight (or 1).
//  * SecretKeyCKKS.open (a decryptor's reveal on a client-weighted preset): per chunk the
//    ciphertext (C0, Σ a_i), flooding noise encoded and added, decrypted and decoded.
//
// Nothing here is cryptography of our own: encoding, encryption, sampling, arithmetic mod q,
// decryption and serialisation are SEAL's calls; this file only batches them. The bytes it
// writes load in any SEAL 4.x (TenSEAL's included), which tests/test_native.py checks.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <complex>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "seal/seal.h"
#include "seal/util/polyarithsmallmod.h"
#include "seal/util/rlwe.h"
#include "seal/util/uintarithsmallmod.h"

namespace py = pybind11;

namespace {

seal::SEALContext make_context(std::size_t n, const std::vector<int> &coeff_bits) {
    seal::EncryptionParameters parms(seal::scheme_type::ckks);
    parms.set_poly_modulus_degree(n);
    parms.set_coeff_modulus(seal::CoeffModulus::Create(n, coeff_bits));
    seal::SEALContext context(parms, true, seal::sec_level_type::tc128);
    if (!context.parameters_set()) {
        throw std::invalid_argument(std::string("SEAL rejects the parameters: ") +
                                    context.parameter_error_message());
    }
    return context;
}

py::bytes parms_id_bytes(const seal::parms_id_type &id) {
    return py::bytes(reinterpret_cast<const char *>(id.data()), sizeof(id));
}

// Run f(begin, end) over [0, count) split into contiguous ranges, one per thread.
template <typename F>
void parallel_ranges(std::size_t count, std::size_t threads, F f) {
    threads = std::max<std::size_t>(1, std::min(threads, count));
    if (threads == 1) {
        f(0, count);
        return;
    }
    std::vector<std::thread> pool;
    std::vector<std::exception_ptr> errors(threads);
    std::size_t per = (count + threads - 1) / threads;
    for (std::size_t t = 0; t < threads; t++) {
        std::size_t begin = t * per, end = std::min(count, begin + per);
        pool.emplace_back([&, t, begin, end] {
            try {
                if (begin < end) f(begin, end);
            } catch (...) {
                errors[t] = std::current_exception();
            }
        });
    }
    for (auto &th : pool) th.join();
    for (auto &e : errors)
        if (e) std::rethrow_exception(e);
}

// One parameter set's SEAL context, built once (NTT tables, prime checks: milliseconds) and
// shared by every key holder and expander of a process; a SEALContext copies cheaply.
class Parameters {
public:
    Parameters(std::size_t n, std::vector<int> coeff_bits) : context(make_context(n, coeff_bits)) {}
    seal::SEALContext context;
};

class SecretKeyCKKS {
public:
    // secret_key: a SEAL SecretKey, uncompressed (secagg's checked_blob output)
    SecretKeyCKKS(const Parameters &parameters, py::bytes secret_key)
        : context_(parameters.context), encoder_(context_) {
        std::string raw = secret_key;
        secret_.load(context_, reinterpret_cast<const seal::seal_byte *>(raw.data()), raw.size());
        if (!seal::is_valid_for(secret_, context_)) {
            throw std::invalid_argument("the secret key is not valid for these parameters");
        }
        encryptor_ = std::make_unique<seal::Encryptor>(context_, secret_);
        seal::Plaintext zero;
        encoder_.encode(0.0, 1.0, zero);
        // every seeded ciphertext of these parameters has one size: that of an encrypted zero
        // (save_size is only an upper bound)
        auto probe = encryptor_->encrypt_symmetric(zero);
        std::vector<seal::seal_byte> buf(
            static_cast<std::size_t>(probe.save_size(seal::compr_mode_type::none)));
        ct_bytes_ = static_cast<std::size_t>(
            probe.save(buf.data(), buf.size(), seal::compr_mode_type::none));
    }

    py::bytes first_parms_id() const { return parms_id_bytes(context_.first_parms_id()); }
    std::size_t ciphertext_bytes() const { return ct_bytes_; }

    // values: float64, any length; chunk j carries values[j*per : (j+1)*per] (zero-padded),
    // slot i of a chunk = values[i] + 1j * values[half + i]. Returns the chunks' uncompressed
    // seeded ciphertexts back to back, ciphertext_bytes() each.
    py::bytes encrypt(py::array_t<double, py::array::c_style | py::array::forcecast> values,
                      double scale, std::size_t threads) const {
        auto view = values.unchecked<1>();
        const double *data = view.data(0);
        std::size_t count = static_cast<std::size_t>(view.shape(0));
        std::size_t half = encoder_.slot_count(), per = 2 * half;
        // at least one chunk, as secagg's chunks_for: an empty vector is one chunk of zeros
        std::size_t chunks = std::max<std::size_t>(1, (count + per - 1) / per);
        std::string out(chunks * ct_bytes_, '\0');
        char *dst = out.data();
        {
            py::gil_scoped_release release;
            parallel_ranges(chunks, threads, [&](std::size_t begin, std::size_t end) {
                std::vector<std::complex<double>> slots(half);
                seal::Plaintext pt;
                for (std::size_t j = begin; j < end; j++) {
                    std::size_t at = j * per;
                    for (std::size_t i = 0; i < half; i++) {
                        double re = at + i < count ? data[at + i] : 0.0;
                        double im = at + half + i < count ? data[at + half + i] : 0.0;
                        slots[i] = {re, im};
                    }
                    encoder_.encode(slots, scale, pt);
                    auto written = encryptor_->encrypt_symmetric(pt).save(
                        reinterpret_cast<seal::seal_byte *>(dst + j * ct_bytes_), ct_bytes_,
                        seal::compr_mode_type::none);
                    if (static_cast<std::size_t>(written) != ct_bytes_) {
                        throw std::runtime_error("a seeded ciphertext changed size");
                    }
                }
            });
        }
        return py::bytes(out);
    }

    // A client-weighted aggregate, opened: per chunk the ciphertext (c0[j], c1[j]) at the
    // first data level and ``scale``, plus ``noise`` (slot values, as the values are laid
    // out; empty for none) encoded at the ciphertext's scale and added before decryption,
    // then decrypted and decoded. Returns chunks * N reals.
    py::array_t<double> open(
        py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast> c0,
        py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast> c1, double scale,
        py::array_t<double, py::array::c_style | py::array::forcecast> noise,
        std::size_t threads) const {
        auto data = context_.first_context_data();
        const auto &moduli = data->parms().coeff_modulus();
        std::size_t n = data->parms().poly_modulus_degree(), width = n * moduli.size();
        if (c0.ndim() != 2 || c1.ndim() != 2 || c0.shape(1) != static_cast<py::ssize_t>(width) ||
            c1.shape(0) != c0.shape(0) || c1.shape(1) != c0.shape(1)) {
            throw std::invalid_argument("c0 and c1 must both be (chunks, N * primes)");
        }
        std::size_t chunks = static_cast<std::size_t>(c0.shape(0));
        std::size_t half = encoder_.slot_count(), per = 2 * half;
        if (noise.size() != 0 && static_cast<std::size_t>(noise.size()) != chunks * per) {
            throw std::invalid_argument("noise must be empty or one value per slot value");
        }
        for (std::size_t k = 0; k < moduli.size(); k++) {  // every coefficient below its prime
            for (const auto *poly : {c0.data(), c1.data()}) {
                for (std::size_t j = 0; j < chunks; j++) {
                    const std::uint64_t *p = poly + j * width + k * n;
                    if (std::any_of(p, p + n, [&](std::uint64_t v) { return v >= moduli[k].value(); }))
                        throw std::invalid_argument("a coefficient is not below its prime");
                }
            }
        }
        py::array_t<double> result(chunks * per);
        double *out = result.mutable_data();
        const std::uint64_t *a0 = c0.data(), *a1 = c1.data();
        const double *z = noise.size() ? noise.data() : nullptr;
        {
            py::gil_scoped_release release;
            parallel_ranges(chunks, threads, [&](std::size_t begin, std::size_t end) {
                seal::Evaluator evaluator(context_);
                seal::Decryptor decryptor(context_, secret_);
                seal::Ciphertext ct(context_, context_.first_parms_id());
                seal::Plaintext pt;
                std::vector<std::complex<double>> slots(half);
                for (std::size_t j = begin; j < end; j++) {
                    ct.resize(context_, context_.first_parms_id(), 2);
                    std::copy(a0 + j * width, a0 + (j + 1) * width, ct.data(0));
                    std::copy(a1 + j * width, a1 + (j + 1) * width, ct.data(1));
                    ct.is_ntt_form() = true;
                    ct.scale() = scale;
                    if (z) {
                        for (std::size_t i = 0; i < half; i++)
                            slots[i] = {z[j * per + i], z[j * per + half + i]};
                        encoder_.encode(slots, ct.parms_id(), scale, pt);
                        evaluator.add_plain_inplace(ct, pt);
                    }
                    decryptor.decrypt(ct, pt);
                    encoder_.decode(pt, slots);
                    for (std::size_t i = 0; i < half; i++) {
                        out[j * per + i] = slots[i].real();
                        out[j * per + half + i] = slots[i].imag();
                    }
                }
            });
        }
        return result;
    }

private:
    seal::SEALContext context_;
    seal::CKKSEncoder encoder_;
    seal::SecretKey secret_;
    std::unique_ptr<seal::Encryptor> encryptor_;
    std::size_t ct_bytes_ = 0;
};

// seeds: for each upload, its chunks' PRNG infos back to back (prng type byte + 64-byte
// seed, as a seeded ciphertext ends); factors: one integer per upload, or none for all 1.
// Returns (chunks, n * primes) uint64: per chunk Σ_i factor_i · a_i mod q, a_i the second
// polynomial upload i's seed expands to at the first data level (what SEAL's multiply_plain
// by the constant factor_i and add compute on loaded uploads).
// A SeedExpander holds its parameters' SEAL context (building one costs milliseconds, which
// a small model's many releases would pay on every call).
class SeedExpander {
public:
    explicit SeedExpander(const Parameters &parameters) : context_(parameters.context) {}

    py::array_t<std::uint64_t> sum(std::vector<py::bytes> seeds, std::size_t chunks,
                                   std::vector<std::int64_t> factors,
                                   std::size_t threads) const;

private:
    seal::SEALContext context_;
};

py::array_t<std::uint64_t> SeedExpander::sum(std::vector<py::bytes> seeds, std::size_t chunks,
                                             std::vector<std::int64_t> factors,
                                             std::size_t threads) const {
    constexpr std::size_t info = 1 + seal::prng_seed_byte_count;
    const seal::SEALContext &context = context_;
    auto data = context.first_context_data();
    const auto &parms = data->parms();
    const auto &moduli = parms.coeff_modulus();
    std::size_t n = parms.poly_modulus_degree();
    std::size_t primes = moduli.size(), width = n * primes;
    std::vector<std::string> raw;
    for (auto &s : seeds) {
        raw.emplace_back(s);
        if (raw.back().size() != chunks * info) {
            throw std::invalid_argument("each upload needs one 65-byte PRNG info per chunk");
        }
    }
    if (raw.empty()) throw std::invalid_argument("no uploads to expand");
    if (!factors.empty() && factors.size() != raw.size()) {
        throw std::invalid_argument("one factor per upload, or none");
    }
    // each factor mod each prime (a negative one as q - |k| mod q)
    std::vector<std::uint64_t> reduced(raw.size() * primes, 1);
    for (std::size_t i = 0; i < factors.size(); i++) {
        std::uint64_t magnitude = factors[i] < 0 ? 0 - static_cast<std::uint64_t>(factors[i])
                                                 : static_cast<std::uint64_t>(factors[i]);
        for (std::size_t k = 0; k < primes; k++) {
            std::uint64_t r = seal::util::barrett_reduce_64(magnitude, moduli[k]);
            reduced[i * primes + k] = factors[i] < 0 && r ? moduli[k].value() - r : r;
        }
    }
    py::array_t<std::uint64_t> result({chunks, width});
    std::uint64_t *out = result.mutable_data();
    {
        py::gil_scoped_release release;
        parallel_ranges(chunks, threads, [&](std::size_t begin, std::size_t end) {
            std::vector<std::uint64_t> a(width);
            for (std::size_t j = begin; j < end; j++) {
                std::uint64_t *total = out + j * width;
                std::fill(total, total + width, 0);
                for (std::size_t i = 0; i < raw.size(); i++) {
                    const char *p = raw[i].data() + j * info;
                    auto type = static_cast<seal::prng_type>(static_cast<std::uint8_t>(p[0]));
                    seal::prng_seed_type seed;
                    std::memcpy(seed.data(), p + 1, seal::prng_seed_byte_count);
                    auto prng = seal::UniformRandomGeneratorInfo(type, seed).make_prng();
                    if (!prng) throw std::invalid_argument("unsupported PRNG type in a seed");
                    seal::util::sample_poly_uniform(prng, parms, a.data());
                    for (std::size_t k = 0; k < primes; k++) {
                        std::uint64_t factor = reduced[i * primes + k];
                        if (factor != 1) {
                            seal::util::multiply_poly_scalar_coeffmod(
                                a.data() + k * n, n, factor, moduli[k], a.data() + k * n);
                        }
                        seal::util::add_poly_coeffmod(total + k * n, a.data() + k * n, n,
                                                      moduli[k], total + k * n);
                    }
                }
            }
        });
    }
    return result;
}

}  // namespace

PYBIND11_MODULE(_seal_native, m) {
    m.doc() = "secagg's batched, in-memory seeded CKKS encryption and seed expansion over SEAL";
    m.attr("SEAL_VERSION") = std::to_string(SEAL_VERSION_MAJOR) + "." +
                             std::to_string(SEAL_VERSION_MINOR) + "." +
                             std::to_string(SEAL_VERSION_PATCH);
    py::class_<Parameters>(m, "Parameters")
        .def(py::init<std::size_t, std::vector<int>>(), py::arg("n"), py::arg("coeff_bits"));
    py::class_<SecretKeyCKKS>(m, "SecretKeyCKKS")
        .def(py::init<const Parameters &, py::bytes>(), py::arg("parameters"),
             py::arg("secret_key"))
        .def_property_readonly("first_parms_id", &SecretKeyCKKS::first_parms_id)
        .def_property_readonly("ciphertext_bytes", &SecretKeyCKKS::ciphertext_bytes)
        .def("encrypt", &SecretKeyCKKS::encrypt, py::arg("values"), py::arg("scale"),
             py::arg("threads") = 1)
        .def("open", &SecretKeyCKKS::open, py::arg("c0"), py::arg("c1"), py::arg("scale"),
             py::arg("noise"), py::arg("threads") = 1);
    py::class_<SeedExpander>(m, "SeedExpander")
        .def(py::init<const Parameters &>(), py::arg("parameters"))
        .def("sum", &SeedExpander::sum, py::arg("seeds"), py::arg("chunks"),
             py::arg("factors") = std::vector<std::int64_t>(), py::arg("threads") = 1);
}
