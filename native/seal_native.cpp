// secagg's native path over Microsoft SEAL 4.1: the two loops a round spends its crypto time
// in, each in one call, in memory, with the GIL released.
//
//  * SeededEncryptor.encrypt: encode N reals a chunk (two per complex slot, as secagg's Python
//    path does) and encrypt them with SEAL's seeded symmetric encryption, every chunk of a
//    vector in one call, written in SEAL's own uncompressed format (8 bytes a value, no zstd,
//    no scratch file), chunks spread over threads.
//  * expand_seed_sum: for each chunk, the sum over uploads of the second polynomial SEAL
//    expands from each upload's seed (what Ciphertext::load does for a seeded ciphertext).
//
// Nothing here is cryptography of our own: encoding, encryption, sampling and serialisation
// are SEAL's calls; this file only batches them. The bytes it writes load in any SEAL 4.x
// (TenSEAL's included), which the tests check.

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

class SeededEncryptor {
public:
    // secret_key: a SEAL SecretKey, uncompressed (secagg's checked_blob output)
    SeededEncryptor(std::size_t n, std::vector<int> coeff_bits, py::bytes secret_key)
        : context_(make_context(n, coeff_bits)), encoder_(context_) {
        std::string raw = secret_key;
        secret_.load(context_, reinterpret_cast<const seal::seal_byte *>(raw.data()), raw.size());
        if (!seal::is_valid_for(secret_, context_)) {
            throw std::invalid_argument("the secret key is not valid for these parameters");
        }
        encryptor_ = std::make_unique<seal::Encryptor>(context_, secret_);
        seal::Plaintext zero;
        encoder_.encode(0.0, 1.0, zero);
        ct_bytes_ = static_cast<std::size_t>(
            encryptor_->encrypt_symmetric(zero).save_size(seal::compr_mode_type::none));
        // save_size is an upper bound; the actual size of a seeded ciphertext is fixed
        std::vector<seal::seal_byte> buf(ct_bytes_);
        ct_bytes_ = static_cast<std::size_t>(encryptor_->encrypt_symmetric(zero).save(
            buf.data(), buf.size(), seal::compr_mode_type::none));
    }

    py::bytes first_parms_id() const { return parms_id_bytes(context_.first_parms_id()); }
    std::size_t ciphertext_bytes() const { return ct_bytes_; }
    std::size_t values_per_ciphertext() const { return encoder_.slot_count() * 2; }

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

private:
    seal::SEALContext context_;
    seal::CKKSEncoder encoder_;
    seal::SecretKey secret_;
    std::unique_ptr<seal::Encryptor> encryptor_;
    std::size_t ct_bytes_ = 0;
};

// seeds: for each upload, its chunks' PRNG infos back to back (prng type byte + 64-byte
// seed, as a seeded ciphertext ends); returns (chunks, n * primes) uint64: per chunk the sum
// mod q of the second polynomials those seeds expand to, at the first data level.
py::array_t<std::uint64_t> expand_seed_sum(std::size_t n, std::vector<int> coeff_bits,
                                           std::vector<py::bytes> seeds, std::size_t chunks,
                                           std::size_t threads) {
    constexpr std::size_t info = 1 + seal::prng_seed_byte_count;
    seal::SEALContext context = make_context(n, coeff_bits);
    auto data = context.first_context_data();
    const auto &parms = data->parms();
    const auto &moduli = parms.coeff_modulus();
    std::size_t primes = moduli.size(), width = n * primes;
    std::vector<std::string> raw;
    for (auto &s : seeds) {
        raw.emplace_back(s);
        if (raw.back().size() != chunks * info) {
            throw std::invalid_argument("each upload needs one 65-byte PRNG info per chunk");
        }
    }
    if (raw.empty()) throw std::invalid_argument("no uploads to expand");
    py::array_t<std::uint64_t> result({chunks, width});
    std::uint64_t *out = result.mutable_data();
    {
        py::gil_scoped_release release;
        parallel_ranges(chunks, threads, [&](std::size_t begin, std::size_t end) {
            std::vector<std::uint64_t> a(width);
            for (std::size_t j = begin; j < end; j++) {
                std::uint64_t *total = out + j * width;
                std::fill(total, total + width, 0);
                for (const auto &r : raw) {
                    const char *p = r.data() + j * info;
                    auto type = static_cast<seal::prng_type>(static_cast<std::uint8_t>(p[0]));
                    seal::prng_seed_type seed;
                    std::memcpy(seed.data(), p + 1, seal::prng_seed_byte_count);
                    auto prng = seal::UniformRandomGeneratorInfo(type, seed).make_prng();
                    if (!prng) throw std::invalid_argument("unsupported PRNG type in a seed");
                    seal::util::sample_poly_uniform(prng, parms, a.data());
                    for (std::size_t k = 0; k < primes; k++) {
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
    py::class_<SeededEncryptor>(m, "SeededEncryptor")
        .def(py::init<std::size_t, std::vector<int>, py::bytes>(), py::arg("n"),
             py::arg("coeff_bits"), py::arg("secret_key"))
        .def_property_readonly("first_parms_id", &SeededEncryptor::first_parms_id)
        .def_property_readonly("ciphertext_bytes", &SeededEncryptor::ciphertext_bytes)
        .def_property_readonly("values_per_ciphertext", &SeededEncryptor::values_per_ciphertext)
        .def("encrypt", &SeededEncryptor::encrypt, py::arg("values"), py::arg("scale"),
             py::arg("threads") = 1);
    m.def("expand_seed_sum", &expand_seed_sum, py::arg("n"), py::arg("coeff_bits"),
          py::arg("seeds"), py::arg("chunks"), py::arg("threads") = 1);
}
