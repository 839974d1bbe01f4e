// secagg's native path over Microsoft SEAL 4.1: the loops a round spends its crypto time in,
// each in one call, in memory, with the GIL released and chunks spread over threads.
//
//  * SecretKeyCKKS.encrypt (a client's upload): encode N reals a chunk (two per complex slot,
//    as secagg's Python path does) and encrypt them with SEAL's seeded symmetric encryption,
//    written in SEAL's own uncompressed format (8 bytes a value, no zstd, no scratch file).
//  * SecretKeyCKKS.masks / encrypt_masked (the same upload, split in time): SEAL's seeded
//    symmetric encryption is an encryption of zero, (−a·s + e, seed of a), to which the encoded
//    plaintext is added (Encryptor::encrypt_internal). masks() makes the encryptions of zero
//    ahead of time, while the client trains; encrypt_masked() is then encode + add + save,
//    and uses each mask once (UploadMasks). fresh_seeds / masks_from: the same masks with the
//    public seeds drawn ahead (committed with the previous upload) and the noise fresh.
//  * SeedExpander.sum (a decryptor's check): per chunk, Σ k_i·a_i over the uploads of a
//    release, a_i the second polynomial SEAL expands from upload i's seed (what
//    Ciphertext::load does for a seeded ciphertext) and k_i its weight (or 1).
//  * SecretKeyCKKS.open (a decryptor's reveal on a client-weighted preset): per chunk the
//    ciphertext (C0, Σ a_i), flooding noise encoded and added, decrypted and decoded.
//    SecretKeyCKKS.encode_noise encodes that noise ahead (while the decryptor trains or
//    waits), exactly as open would (FloodingNoise): open then only adds it, and uses it once.
//  * Ring (the threshold backend's arithmetic in R_p = Z_p[X]/(X^N + 1), p an NTT prime of at
//    most 60 bits): one-time ternary keys, key-additive RLWE masks b = a·k + e + m and their
//    removal with a sum of keys (a expanded per block from a public seed, in the NTT domain),
//    weighted sums mod p (the server's aggregate, the holders' share combinations) and Shamir
//    shares of a polynomial, coefficient-wise.
//
// Nothing here is cryptography of our own: encoding, encryption, sampling, arithmetic mod q,
// decryption, serialisation, the NTT, the samplers, the PRNGs and the hash deriving their seeds
// are SEAL's calls; this file only batches them. The bytes it writes load in any SEAL 4.x
// (TenSEAL's included), which tests/test_native.py checks.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <complex>
#include <memory>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "seal/seal.h"
#include "seal/util/blake2.h"
#include "seal/util/ntt.h"
#include "seal/util/numth.h"
#include "seal/util/polyarithsmallmod.h"
#include "seal/util/rlwe.h"
#include "seal/util/uintarithsmallmod.h"

namespace py = pybind11;

namespace {

// a seeded ciphertext ends with its PRNG's type (one byte) and 64-byte seed
constexpr std::size_t kSeedInfo = 1 + seal::prng_seed_byte_count;

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

// total += factor · x mod q over n coefficients (SEAL's scalar multiply and add; a factor of
// 1 skips the multiply, of 0 adds nothing); ``scratch`` holds the product (it may be x).
void add_scaled(std::uint64_t *total, const std::uint64_t *x, std::size_t n, std::uint64_t factor,
                const seal::Modulus &q, std::uint64_t *scratch) {
    if (factor == 0) return;
    if (factor != 1) {
        seal::util::multiply_poly_scalar_coeffmod(x, n, factor, q, scratch);
        x = scratch;
    }
    seal::util::add_poly_coeffmod(total, x, n, q, total);
}

// One parameter set's SEAL context, built once (NTT tables, prime checks: milliseconds) and
// shared by every key holder and expander of a process; a SEALContext copies cheaply.
class Parameters {
public:
    Parameters(std::size_t n, std::vector<int> coeff_bits) : context(make_context(n, coeff_bits)) {}
    seal::SEALContext context;
};

#ifndef SECAGG_PUBLIC_ONLY  // the key-holding half: not in the public module
// Zero a ciphertext's coefficients, then free them (the mask of an upload is key material).
void wipe_ciphertext(seal::Ciphertext &ct) {
    if (ct.size()) {
        std::fill(ct.data(), ct.data() + ct.size() * ct.poly_modulus_degree() *
                                             ct.coeff_modulus_size(), 0);
    }
    ct.release();
}

// One upload's precomputed masks: per chunk a seeded symmetric encryption of zero at the first
// data level (util::encrypt_zero_symmetric, what Encryptor::encrypt_symmetric starts with).
// They are key material: each set is used once (taking it wipes it, whether or not the
// encryption then succeeds) and never leaves this object (no pickling, no bytes out).
class UploadMasks {
public:
    UploadMasks() = default;
    UploadMasks(const UploadMasks &) = delete;
    UploadMasks &operator=(const UploadMasks &) = delete;
    ~UploadMasks() { wipe(); }

    std::size_t chunks() const { return cts_.size(); }
    bool used() const { return used_; }
    void wipe() {
        for (auto &ct : cts_) wipe_ciphertext(ct);
        cts_.clear();
        used_ = true;
    }
    // the masks, handed over once: this object holds nothing after
    std::vector<seal::Ciphertext> take() {
        if (used_) throw std::invalid_argument("these masks were used already");
        std::vector<seal::Ciphertext> out = std::move(cts_);
        wipe();
        return out;
    }

    std::vector<seal::Ciphertext> cts_;
    bool used_ = false;
};

// A reveal's flooding noise encoded ahead: per chunk the plaintext open() would encode from
// the same slot values at the same scale (NTT form, first data level), back to back. Secret:
// it is used by one opening (which wipes it, whether or not the opening succeeds) and never
// leaves this object (no pickling, no bytes out).
class FloodingNoise {
public:
    FloodingNoise() = default;
    FloodingNoise(const FloodingNoise &) = delete;
    FloodingNoise &operator=(const FloodingNoise &) = delete;
    ~FloodingNoise() { wipe(); }

    std::size_t chunks() const { return chunks_; }
    double scale() const { return scale_; }
    bool used() const { return used_; }
    void wipe() {
        std::fill(coeffs_.begin(), coeffs_.end(), 0);
        coeffs_.clear();
        coeffs_.shrink_to_fit();
        used_ = true;
    }

    std::vector<std::uint64_t> coeffs_;
    std::size_t chunks_ = 0;
    double scale_ = 0.0;
    bool used_ = false;
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
        return encode_chunks(values, scale, threads, [&](std::size_t, seal::Plaintext &pt) {
            return encryptor_->encrypt_symmetric(pt);
        });
    }

    // ``chunks`` fresh masks for one upload (the work of encrypt() that does not depend on the
    // values: expanding a from a new seed, sampling e, −a·s + e in the NTT domain).
    std::unique_ptr<UploadMasks> masks(std::size_t chunks, std::size_t threads) const {
        if (chunks == 0) throw std::invalid_argument("an upload has at least one chunk");
        auto out = std::make_unique<UploadMasks>();
        out->cts_.resize(chunks);
        {
            py::gil_scoped_release release;
            parallel_ranges(chunks, threads, [&](std::size_t begin, std::size_t end) {
                for (std::size_t j = begin; j < end; j++) {
                    seal::util::encrypt_zero_symmetric(secret_, context_,
                                                       context_.first_parms_id(), true, true,
                                                       out->cts_[j]);
                }
            });
        }
        return out;
    }

    // Seeds for ``chunks`` future masks (65 bytes a chunk: the PRNG type, then its 64-byte seed,
    // as a seeded ciphertext ends), drawn as util::encrypt_zero_symmetric draws its public seed:
    // from a fresh PRNG of the parameters' random generator. They are public (the a they expand
    // to is in the upload); what must never happen twice is their use (masks_from).
    py::bytes fresh_seeds(std::size_t chunks) const {
        if (chunks == 0) throw std::invalid_argument("an upload has at least one chunk");
        const auto &parms = context_.first_context_data()->parms();
        std::string out(chunks * kSeedInfo, '\0');
        for (std::size_t j = 0; j < chunks; j++) {
            seal::prng_seed_type seed;
            parms.random_generator()->create()->generate(
                seal::prng_seed_byte_count, reinterpret_cast<seal::seal_byte *>(seed.data()));
            auto info = seal::UniformRandomGeneratorFactory::DefaultFactory()->create(seed)->info();
            out[j * kSeedInfo] = static_cast<char>(info.type());
            std::memcpy(out.data() + j * kSeedInfo + 1, info.seed().data(),
                        seal::prng_seed_byte_count);
        }
        return py::bytes(out);
    }

    // masks() for given public seeds (fresh_seeds' output, committed before the upload): the
    // encryptions of zero util::encrypt_zero_symmetric makes, each with its chunk's seed for a
    // and fresh noise e from the parameters' random generator, as there. The caller uses a
    // seed once: two uploads under one a and one key would give away the difference of their
    // values (secagg.secret.ckks_masks keeps that promise; CKKSClient refuses a repeated seed).
    std::unique_ptr<UploadMasks> masks_from(py::bytes seeds, std::size_t threads) const {
        std::string raw = seeds;
        if (raw.empty() || raw.size() % kSeedInfo) {
            throw std::invalid_argument("seeds must be 65 bytes a chunk, for at least one chunk");
        }
        std::size_t chunks = raw.size() / kSeedInfo;
        auto default_type =
            seal::UniformRandomGeneratorFactory::DefaultFactory()->create()->info().type();
        for (std::size_t j = 0; j < chunks; j++) {
            if (static_cast<seal::prng_type>(static_cast<std::uint8_t>(raw[j * kSeedInfo])) !=
                default_type) {
                throw std::invalid_argument("a seed names another PRNG than SEAL's default");
            }
        }
        auto data = context_.first_context_data();
        const auto &parms = data->parms();
        const auto &moduli = parms.coeff_modulus();
        std::size_t n = parms.poly_modulus_degree(), primes = moduli.size();
        auto ntt_tables = data->small_ntt_tables();
        std::size_t info_bytes = static_cast<std::size_t>(
            seal::UniformRandomGeneratorInfo::SaveSize(seal::compr_mode_type::none));
        auto out = std::make_unique<UploadMasks>();
        out->cts_.resize(chunks);
        {
            py::gil_scoped_release release;
            parallel_ranges(chunks, threads, [&](std::size_t begin, std::size_t end) {
                // the noise lives in a pool that clears itself, as SEAL's does
                auto pool = seal::MemoryManager::GetPool(seal::mm_prof_opt::mm_force_new, true);
                for (std::size_t j = begin; j < end; j++) {
                    seal::Ciphertext &ct = out->cts_[j];
                    ct.resize(context_, context_.first_parms_id(), 2);
                    ct.is_ntt_form() = true;
                    ct.scale() = 1.0;
                    ct.correction_factor() = 1;
                    seal::prng_seed_type seed;
                    std::memcpy(seed.data(), raw.data() + j * kSeedInfo + 1,
                                seal::prng_seed_byte_count);
                    auto ciphertext_prng =
                        seal::UniformRandomGeneratorFactory::DefaultFactory()->create(seed);
                    std::uint64_t *c0 = ct.data(), *c1 = ct.data(1);
                    seal::util::sample_poly_uniform(ciphertext_prng, parms, c1);
                    auto noise = seal::util::allocate_poly(n, primes, pool);
                    auto bootstrap_prng = parms.random_generator()->create();
                    seal::util::SEAL_NOISE_SAMPLER(bootstrap_prng, parms, noise.get());
                    for (std::size_t k = 0; k < primes; k++) {
                        seal::util::dyadic_product_coeffmod(secret_.data().data() + k * n,
                                                            c1 + k * n, n, moduli[k], c0 + k * n);
                        seal::util::ntt_negacyclic_harvey(noise.get() + k * n, ntt_tables[k]);
                        seal::util::add_poly_coeffmod(noise.get() + k * n, c0 + k * n, n,
                                                      moduli[k], c0 + k * n);
                        seal::util::negate_poly_coeffmod(c0 + k * n, n, moduli[k], c0 + k * n);
                    }
                    // the seed, where a seeded ciphertext keeps it (after an indicator word)
                    c1[0] = static_cast<std::uint64_t>(0xFFFFFFFFFFFFFFFFULL);
                    ciphertext_prng->info().save(reinterpret_cast<seal::seal_byte *>(c1 + 1),
                                                 info_bytes, seal::compr_mode_type::none);
                }
            });
        }
        return out;
    }

    // encrypt() with precomputed masks: the bytes encrypt() writes for these values with these
    // masks' seeds and noise. The masks are taken out of ``masks`` (which is wiped) before
    // anything else, so that no failure leaves them for a second use; wiped here on return.
    py::bytes encrypt_masked(UploadMasks &masks,
                             py::array_t<double, py::array::c_style | py::array::forcecast> values,
                             double scale, std::size_t threads) const {
        struct Wiped {  // the taken masks, wiped however this call ends
            std::vector<seal::Ciphertext> cts;
            ~Wiped() {
                for (auto &ct : cts) wipe_ciphertext(ct);
            }
        } taken{masks.take()};
        if (chunks_of(values) != taken.cts.size()) {
            throw std::invalid_argument("the masks were made for another number of chunks");
        }
        auto data = context_.first_context_data();
        const auto &moduli = data->parms().coeff_modulus();
        std::size_t n = data->parms().poly_modulus_degree();
        return encode_chunks(values, scale, threads,
                             [&](std::size_t j, seal::Plaintext &pt) -> const seal::Ciphertext & {
            seal::Ciphertext &ct = taken.cts[j];
            // Encryptor::encrypt_internal's CKKS branch: the plaintext into c_0
            for (std::size_t k = 0; k < moduli.size(); k++) {
                seal::util::add_poly_coeffmod(ct.data(0) + k * n, pt.data() + k * n, n,
                                              moduli[k], ct.data(0) + k * n);
            }
            ct.scale() = pt.scale();
            return ct;
        });
    }

    // An aggregate, opened (a client-weighted one, or a server-weighted one read out of its
    // checked bytes): per chunk the ciphertext (c0[j], c1[j]) at the
    // first data level and ``scale``, plus ``noise`` (slot values, as the values are laid
    // out; empty for none) encoded at the ciphertext's scale and added before decryption,
    // then decrypted and decoded. Returns chunks * N reals.
    //
    // ``encoded``: the noise encoded ahead (encode_noise) instead of ``noise`` (then empty),
    // for exactly these chunks at exactly this scale; used once: wiped here in any case.
    py::array_t<double> open(
        py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast> c0,
        py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast> c1, double scale,
        py::array_t<double, py::array::c_style | py::array::forcecast> noise,
        std::size_t threads, FloodingNoise *encoded) const {
        struct WipeAfter {
            FloodingNoise *noise;
            ~WipeAfter() {
                if (noise) noise->wipe();
            }
        } wipe_after{encoded};
        if (encoded) {
            if (encoded->used()) throw std::invalid_argument("this flooding noise was used already");
            if (noise.size() != 0) throw std::invalid_argument("noise given twice");
            if (encoded->chunks() != static_cast<std::size_t>(c0.ndim() == 2 ? c0.shape(0) : 0) ||
                encoded->scale() != scale) {
                throw std::invalid_argument("the flooding noise was encoded for another release");
            }
        }
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
        const std::uint64_t *ahead = encoded ? encoded->coeffs_.data() : nullptr;
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
                    } else if (ahead) {  // what add_plain_inplace adds: the plaintext to C0
                        for (std::size_t k = 0; k < moduli.size(); k++) {
                            seal::util::add_poly_coeffmod(ct.data(0) + k * n,
                                                          ahead + j * width + k * n, n,
                                                          moduli[k], ct.data(0) + k * n);
                        }
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

    // ``noise`` (chunks * N slot values, as open takes them) encoded at ``scale`` ahead of
    // the opening it is for: the same plaintexts open would encode (encoder, parms, scale).
    std::unique_ptr<FloodingNoise> encode_noise(
        py::array_t<double, py::array::c_style | py::array::forcecast> noise, double scale,
        std::size_t threads) const {
        std::size_t half = encoder_.slot_count(), per = 2 * half;
        if (noise.size() == 0 || static_cast<std::size_t>(noise.size()) % per != 0) {
            throw std::invalid_argument("noise must be whole chunks of slot values");
        }
        auto data = context_.first_context_data();
        std::size_t width = data->parms().poly_modulus_degree() * data->parms().coeff_modulus().size();
        auto out = std::make_unique<FloodingNoise>();
        out->chunks_ = static_cast<std::size_t>(noise.size()) / per;
        out->scale_ = scale;
        out->coeffs_.assign(out->chunks_ * width, 0);
        const double *z = noise.data();
        std::uint64_t *dst = out->coeffs_.data();
        {
            py::gil_scoped_release release;
            parallel_ranges(out->chunks_, threads, [&](std::size_t begin, std::size_t end) {
                seal::Plaintext pt;
                std::vector<std::complex<double>> slots(half);
                for (std::size_t j = begin; j < end; j++) {
                    for (std::size_t i = 0; i < half; i++)
                        slots[i] = {z[j * per + i], z[j * per + half + i]};
                    encoder_.encode(slots, context_.first_parms_id(), scale, pt);
                    std::copy(pt.data(), pt.data() + width, dst + j * width);
                    std::fill(pt.data(), pt.data() + pt.coeff_count(), 0);
                }
                std::fill(slots.begin(), slots.end(), std::complex<double>());
            });
        }
        return out;
    }

private:
    // at least one chunk, as secagg's chunks_for: an empty vector is one chunk of zeros
    std::size_t chunks_of(const py::array_t<double, py::array::c_style | py::array::forcecast> &v)
        const {
        std::size_t per = 2 * encoder_.slot_count();
        return std::max<std::size_t>(1, (static_cast<std::size_t>(v.size()) + per - 1) / per);
    }

    // Every chunk of ``values`` encoded at ``scale`` (slot i = values[at + i] + 1j ·
    // values[at + half + i], zero-padded) and turned into its seeded ciphertext by
    // ``seal_chunk(j, plaintext)``, saved uncompressed: the chunks back to back,
    // ciphertext_bytes() each. On ``threads`` threads, without the GIL.
    template <typename F>
    py::bytes encode_chunks(py::array_t<double, py::array::c_style | py::array::forcecast> values,
                            double scale, std::size_t threads, F seal_chunk) const {
        auto view = values.unchecked<1>();
        const double *data = view.data(0);
        std::size_t count = static_cast<std::size_t>(view.shape(0));
        std::size_t half = encoder_.slot_count(), per = 2 * half;
        std::size_t chunks = chunks_of(values);
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
                    auto written = seal_chunk(j, pt).save(
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

    seal::SEALContext context_;
    seal::CKKSEncoder encoder_;
    seal::SecretKey secret_;
    std::unique_ptr<seal::Encryptor> encryptor_;
    std::size_t ct_bytes_ = 0;
};

#endif  // SECAGG_PUBLIC_ONLY

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

    // Σ_i factor_i · polys_i mod q, each polys_i a (chunks, n * primes) array of polynomials
    // at the first data level (an upload's first or second polynomials): what SEAL's
    // multiply_plain by the constant factor_i and add compute on the loaded ciphertexts,
    // coefficient-wise (a constant is itself in every NTT slot).
    py::array_t<std::uint64_t> combine(std::vector<py::array_t<std::uint64_t,
                                                                py::array::c_style |
                                                                    py::array::forcecast>>
                                           polys,
                                       std::vector<std::int64_t> factors,
                                       std::size_t threads) const;

private:
    // each factor mod each prime (a negative one as q - |k| mod q), factor-major
    std::vector<std::uint64_t> reduced(const std::vector<std::int64_t> &factors) const;

    seal::SEALContext context_;
};

std::vector<std::uint64_t> SeedExpander::reduced(const std::vector<std::int64_t> &factors) const {
    const auto &moduli = context_.first_context_data()->parms().coeff_modulus();
    std::vector<std::uint64_t> out(factors.size() * moduli.size());
    for (std::size_t i = 0; i < factors.size(); i++) {
        std::uint64_t magnitude = factors[i] < 0 ? 0 - static_cast<std::uint64_t>(factors[i])
                                                 : static_cast<std::uint64_t>(factors[i]);
        for (std::size_t k = 0; k < moduli.size(); k++) {
            std::uint64_t r = seal::util::barrett_reduce_64(magnitude, moduli[k]);
            out[i * moduli.size() + k] = factors[i] < 0 && r ? moduli[k].value() - r : r;
        }
    }
    return out;
}

py::array_t<std::uint64_t> SeedExpander::combine(
    std::vector<py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>> polys,
    std::vector<std::int64_t> factors, std::size_t threads) const {
    auto data = context_.first_context_data();
    const auto &moduli = data->parms().coeff_modulus();
    std::size_t n = data->parms().poly_modulus_degree(), primes = moduli.size();
    std::size_t width = n * primes;
    if (polys.empty()) throw std::invalid_argument("no polynomials to combine");
    if (factors.size() != polys.size()) throw std::invalid_argument("one factor per array");
    std::size_t chunks = 0;
    for (std::size_t i = 0; i < polys.size(); i++) {
        const auto &a = polys[i];
        if (a.ndim() != 2 || a.shape(1) != static_cast<py::ssize_t>(width) ||
            (i && static_cast<std::size_t>(a.shape(0)) != chunks)) {
            throw std::invalid_argument("every array must be (chunks, N * primes), alike");
        }
        chunks = static_cast<std::size_t>(a.shape(0));
        for (std::size_t k = 0; k < primes; k++) {  // every coefficient below its prime
            for (std::size_t j = 0; j < chunks; j++) {
                const std::uint64_t *p = a.data() + j * width + k * n;
                if (std::any_of(p, p + n, [&](std::uint64_t v) { return v >= moduli[k].value(); }))
                    throw std::invalid_argument("a coefficient is not below its prime");
            }
        }
    }
    std::vector<std::uint64_t> ks = reduced(factors);
    std::vector<const std::uint64_t *> rows;
    for (const auto &a : polys) rows.push_back(a.data());
    py::array_t<std::uint64_t> result({chunks, width});
    std::uint64_t *out = result.mutable_data();
    {
        py::gil_scoped_release release;
        parallel_ranges(chunks, threads, [&](std::size_t begin, std::size_t end) {
            std::vector<std::uint64_t> scaled(n);
            for (std::size_t j = begin; j < end; j++) {
                std::uint64_t *total = out + j * width;
                std::fill(total, total + width, 0);
                for (std::size_t i = 0; i < rows.size(); i++) {
                    for (std::size_t k = 0; k < primes; k++) {
                        add_scaled(total + k * n, rows[i] + j * width + k * n, n,
                                   ks[i * primes + k], moduli[k], scaled.data());
                    }
                }
            }
        });
    }
    return result;
}

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
    // each factor mod each prime (none given: 1 for every upload)
    std::vector<std::uint64_t> reduced =
        factors.empty() ? std::vector<std::uint64_t>(raw.size() * primes, 1)
                        : SeedExpander::reduced(factors);
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
                        add_scaled(total + k * n, a.data() + k * n, n, reduced[i * primes + k],
                                   moduli[k], a.data() + k * n);
                    }
                }
            }
        });
    }
    return result;
}

// ---------------------------------------------------------------------------------------------
// The threshold backend's ring R_p = Z_p[X]/(X^N + 1): N a power of two, p a prime ≡ 1 mod 2N
// of at most 60 bits. Polynomials are uint64 coefficient vectors in [0, p).
//
// Every operation is SEAL's: NTTTables and the negacyclic Harvey NTT, dyadic products and the
// poly/scalar arithmetic mod p, the ternary/CBD/uniform samplers of seal/util/rlwe.h (driven by
// a fresh CSPRNG from SEAL's default factory for secrets and errors, by a Blake2xbPRNG for the
// public polynomials), and blake2b to derive each block's PRNG seed from the round's seed.

// A Python int in [0, 2^64) (refuses anything else with a ValueError naming `what`).
// An integer (a Python int, numpy's, anything with __index__) as a Python int.
py::object as_index(py::handle value, const std::string &what) {
    if (PyFloat_Check(value.ptr())) throw std::invalid_argument(what + " must be an integer");
    auto r = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
    if (!r) {
        PyErr_Clear();
        throw std::invalid_argument(what + " must be an integer");
    }
    return r;
}

std::uint64_t checked_u64(py::handle value, const std::string &what) {
    py::object index = as_index(value, what);
    unsigned long long r = PyLong_AsUnsignedLongLong(index.ptr());
    if (r == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
        PyErr_Clear();
        throw std::invalid_argument(what + " must be an integer in [0, 2^64)");
    }
    return static_cast<std::uint64_t>(r);
}

using U64Array = py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>;
using I64Array = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>;

std::string dtype_name(const py::array &a) { return py::str(a.dtype()).cast<std::string>(); }

// An integer array as C-contiguous uint64 (a negative entry wraps past p and fails the range
// checks); floats, booleans and objects are refused rather than silently truncated.
U64Array as_u64(const py::array &a, const std::string &what) {
    char kind = a.dtype().kind();
    if (kind != 'u' && kind != 'i') {
        throw std::invalid_argument(what + " must be an integer (uint64) array, not " +
                                    dtype_name(a));
    }
    auto out = U64Array::ensure(a);
    if (!out) throw std::invalid_argument(what + ": cannot be read as a uint64 array");
    return out;
}

// An integer array as C-contiguous int64; uint64 entries above 2^63 - 1 are refused.
I64Array as_i64(const py::array &a, const std::string &what) {
    char kind = a.dtype().kind();
    if (kind != 'u' && kind != 'i') {
        throw std::invalid_argument(what + " must be an integer (int64) array, not " +
                                    dtype_name(a));
    }
    if (kind == 'u' && a.itemsize() == 8) {
        auto u = as_u64(a, what);
        const std::uint64_t *d = u.data();
        if (std::any_of(d, d + u.size(), [](std::uint64_t v) { return v >> 63; }))
            throw std::invalid_argument(what + ": a value does not fit in int64");
    }
    auto out = I64Array::ensure(a);
    if (!out) throw std::invalid_argument(what + ": cannot be read as an int64 array");
    return out;
}

void check_shape(const py::array &a, std::initializer_list<py::ssize_t> want,
                 const std::string &what, const std::string &expected) {
    bool ok = a.ndim() == static_cast<py::ssize_t>(want.size());
    std::size_t d = 0;
    for (auto w : want) {
        if (ok && w >= 0 && a.shape(d) != w) ok = false;
        d++;
    }
    if (!ok) throw std::invalid_argument(what + " must have shape " + expected);
}

class Ring {
public:
    Ring(std::size_t n, std::uint64_t prime) : n_(n), parms_(seal::scheme_type::ckks) {
        if (n < 1024 || n > 32768 || (n & (n - 1)) != 0) {
            throw std::invalid_argument("n must be a power of two in [1024, 32768], not " +
                                        std::to_string(n));
        }
        if (prime < 3 || (prime >> SEAL_USER_MOD_BIT_COUNT_MAX) != 0) {
            throw std::invalid_argument("p must be a prime of 2 to 60 bits, not " +
                                        std::to_string(prime));
        }
        modulus_ = seal::Modulus(prime);
        if (!modulus_.is_prime()) {
            throw std::invalid_argument("p = " + std::to_string(prime) + " is not prime");
        }
        if ((prime - 1) % (2 * n) != 0) {
            throw std::invalid_argument("p = " + std::to_string(prime) +
                                        " is not 1 mod 2n: no negacyclic NTT of size " +
                                        std::to_string(n));
        }
        log_n_ = seal::util::get_power_of_two(n);
        parms_.set_poly_modulus_degree(n);
        parms_.set_coeff_modulus({modulus_});
        tables_ = std::make_unique<seal::util::NTTTables>(log_n_, modulus_);
    }

    std::size_t n() const { return n_; }
    std::uint64_t p() const { return modulus_.value(); }
    int bits() const { return modulus_.bit_count(); }

    py::array_t<std::uint64_t> key() const {
        py::array_t<std::uint64_t> out(n_);
        auto prng = seal::UniformRandomGeneratorFactory::DefaultFactory()->create();
        seal::util::sample_poly_ternary(prng, parms_, out.mutable_data());
        return out;
    }

    py::array_t<std::uint64_t> public_polys(py::bytes seed, std::size_t blocks,
                                            std::size_t threads) const {
        std::string s = checked_seed(seed);
        py::array_t<std::uint64_t> out({blocks, n_});
        std::uint64_t *dst = out.mutable_data();
        {
            py::gil_scoped_release release;
            parallel_ranges(blocks, threads, [&](std::size_t begin, std::size_t end) {
                for (std::size_t b = begin; b < end; b++) expand(s, b, dst + b * n_);
            });
        }
        return out;
    }

    // b_b = INTT(a_b ⊙ NTT(key)) + e_b + (messages_b mod p)
    py::array_t<std::uint64_t> mask(py::array key, py::bytes seed, py::array messages,
                                    std::size_t threads) const {
        std::vector<std::uint64_t> key_ntt = ntt_of(key, "key");
        std::string s = checked_seed(seed);
        auto msg = as_i64(messages, "messages");
        check_shape(msg, {-1, static_cast<py::ssize_t>(n_)}, "messages", "(blocks, n)");
        std::size_t blocks = static_cast<std::size_t>(msg.shape(0));
        const std::int64_t *m = msg.data();
        const std::uint64_t p = modulus_.value(), half = p / 2;  // |m| <= (p - 1) / 2
        py::array_t<std::uint64_t> out({blocks, n_});
        std::uint64_t *dst = out.mutable_data();
        {
            py::gil_scoped_release release;
            parallel_ranges(blocks, threads, [&](std::size_t begin, std::size_t end) {
                auto prng = seal::UniformRandomGeneratorFactory::DefaultFactory()->create();
                std::vector<std::uint64_t> e(n_), mm(n_);
                for (std::size_t b = begin; b < end; b++) {
                    const std::int64_t *row = m + b * n_;
                    for (std::size_t j = 0; j < n_; j++) {
                        std::uint64_t mag = row[j] < 0 ? 0 - static_cast<std::uint64_t>(row[j])
                                                       : static_cast<std::uint64_t>(row[j]);
                        if (mag > half) {
                            throw std::invalid_argument(
                                "messages: |m| must be below p/2 (a value is " +
                                std::to_string(row[j]) + ", p = " + std::to_string(p) + ")");
                        }
                        mm[j] = row[j] < 0 && mag ? p - mag : mag;
                    }
                    std::uint64_t *a = dst + b * n_;
                    expand(s, b, a);
                    seal::util::dyadic_product_coeffmod(a, key_ntt.data(), n_, modulus_, a);
                    seal::util::inverse_ntt_negacyclic_harvey(a, *tables_);
                    seal::util::sample_poly_cbd(prng, parms_, e.data());
                    seal::util::add_poly_coeffmod(a, e.data(), n_, modulus_, a);
                    seal::util::add_poly_coeffmod(a, mm.data(), n_, modulus_, a);
                }
                seal::util::seal_memzero(e.data(), n_ * sizeof(std::uint64_t));
                seal::util::seal_memzero(mm.data(), n_ * sizeof(std::uint64_t));
            });
        }
        seal::util::seal_memzero(key_ntt.data(), n_ * sizeof(std::uint64_t));
        return out;
    }

    // total_b − INTT(a_b ⊙ NTT(key_sum)) mod p, centred into (−p/2, p/2]
    py::array_t<std::int64_t> unmask(py::array total, py::array key_sum, py::bytes seed,
                                     std::size_t threads) const {
        auto tot = as_u64(total, "total");
        check_shape(tot, {-1, static_cast<py::ssize_t>(n_)}, "total", "(blocks, n)");
        std::vector<std::uint64_t> key_ntt = ntt_of(key_sum, "key_sum");
        std::string s = checked_seed(seed);
        std::size_t blocks = static_cast<std::size_t>(tot.shape(0));
        const std::uint64_t *t = tot.data();
        const std::uint64_t p = modulus_.value(), half = p / 2;
        py::array_t<std::int64_t> out({blocks, n_});
        std::int64_t *dst = out.mutable_data();
        {
            py::gil_scoped_release release;
            parallel_ranges(blocks, threads, [&](std::size_t begin, std::size_t end) {
                std::vector<std::uint64_t> a(n_);
                for (std::size_t b = begin; b < end; b++) {
                    const std::uint64_t *row = t + b * n_;
                    check_below(row, n_, "total");
                    expand(s, b, a.data());
                    seal::util::dyadic_product_coeffmod(a.data(), key_ntt.data(), n_, modulus_,
                                                        a.data());
                    seal::util::inverse_ntt_negacyclic_harvey(a.data(), *tables_);
                    seal::util::sub_poly_coeffmod(row, a.data(), n_, modulus_, a.data());
                    std::int64_t *o = dst + b * n_;
                    for (std::size_t j = 0; j < n_; j++) {
                        o[j] = a[j] > half ? -static_cast<std::int64_t>(p - a[j])
                                           : static_cast<std::int64_t>(a[j]);
                    }
                }
            });
        }
        seal::util::seal_memzero(key_ntt.data(), n_ * sizeof(std::uint64_t));
        return out;
    }

    // Σ_i weights[i]·polys[i] mod p; polys a (m, k) array or a sequence of m arrays of k
    // values each (no stacking copy). Fused per tile: SEAL's Shoup multiply and add mod p.
    py::array_t<std::uint64_t> combine(py::object polys, py::sequence weights,
                                       std::size_t threads) const {
        std::vector<U64Array> keep;
        std::vector<const std::uint64_t *> rows;
        std::size_t k = 0;
        if (py::isinstance<py::list>(polys) || py::isinstance<py::tuple>(polys)) {
            bool first = true;
            for (auto item : py::reinterpret_borrow<py::sequence>(polys)) {
                auto entry = py::array::ensure(item);
                if (!entry) throw std::invalid_argument("polys: every entry must be an array");
                auto arr = as_u64(entry, "polys");
                if (first) k = static_cast<std::size_t>(arr.size());
                first = false;
                if (static_cast<std::size_t>(arr.size()) != k)
                    throw std::invalid_argument("polys: every entry must have the same length");
                rows.push_back(arr.data());
                keep.push_back(std::move(arr));
            }
        } else {
            auto whole = py::array::ensure(polys);
            if (!whole) throw std::invalid_argument("polys must be an (m, k) array");
            auto arr = as_u64(whole, "polys");
            check_shape(arr, {-1, -1}, "polys", "(m, k)");
            k = static_cast<std::size_t>(arr.shape(1));
            for (py::ssize_t i = 0; i < arr.shape(0); i++) rows.push_back(arr.data() + i * k);
            keep.push_back(std::move(arr));
        }
        if (rows.empty()) throw std::invalid_argument("polys: nothing to combine");
        if (static_cast<std::size_t>(py::len(weights)) != rows.size()) {
            throw std::invalid_argument("one weight per polynomial: " +
                                        std::to_string(rows.size()) + " polynomials, " +
                                        std::to_string(py::len(weights)) + " weights");
        }
        std::vector<seal::util::MultiplyUIntModOperand> w(rows.size());
        py::int_ pmod(modulus_.value());
        for (std::size_t i = 0; i < rows.size(); i++) {
            py::object wi = as_index(weights[i], "each weight");
            auto r = py::reinterpret_steal<py::object>(PyNumber_Remainder(wi.ptr(), pmod.ptr()));
            if (!r) throw py::error_already_set();
            w[i].set(checked_u64(r, "a weight mod p"), modulus_);
        }
        py::array_t<std::uint64_t> out(k);
        std::uint64_t *dst = out.mutable_data();
        constexpr std::size_t tile = 4096;
        std::size_t tiles = (k + tile - 1) / tile;
        {
            py::gil_scoped_release release;
            parallel_ranges(tiles, threads, [&](std::size_t begin, std::size_t end) {
                for (std::size_t t = begin; t < end; t++) {
                    std::size_t lo = t * tile, len = std::min(k, lo + tile) - lo;
                    std::uint64_t *acc = dst + lo;
                    std::fill(acc, acc + len, 0);
                    for (std::size_t i = 0; i < rows.size(); i++) {
                        const std::uint64_t *x = rows[i] + lo;
                        check_below(x, len, "polys");
                        const auto wi = w[i];
                        if (wi.operand == 0) continue;
                        if (wi.operand == 1) {
                            seal::util::add_poly_coeffmod(acc, x, len, modulus_, acc);
                            continue;
                        }
                        for (std::size_t j = 0; j < len; j++) {
                            acc[j] = seal::util::add_uint_mod(
                                acc[j], seal::util::multiply_uint_mod(x[j], wi, modulus_),
                                modulus_);
                        }
                    }
                }
            });
        }
        return out;
    }

    // Shamir shares of each coefficient: f(x) = secret + Σ_{d=1}^{t-1} r_d·x^d, r_d uniform
    // mod p (SEAL's sample_poly_uniform, fresh CSPRNG), f evaluated at each x by Horner.
    py::array_t<std::uint64_t> shares(py::array secret, std::size_t t, py::sequence xs,
                                      std::size_t threads) const {
        auto sec = as_u64(secret, "secret");
        check_shape(sec, {static_cast<py::ssize_t>(n_)}, "secret", "(n,)");
        check_below(sec.data(), n_, "secret");
        std::size_t count = static_cast<std::size_t>(py::len(xs));
        if (t < 1 || t > count) {
            throw std::invalid_argument("need 1 <= t <= len(xs) (t = " + std::to_string(t) +
                                        ", " + std::to_string(count) + " points)");
        }
        std::vector<seal::util::MultiplyUIntModOperand> points(count);
        for (std::size_t i = 0; i < count; i++) {
            std::uint64_t x = checked_u64(xs[i], "each x");
            if (x == 0 || x >= modulus_.value())
                throw std::invalid_argument("each x must be in [1, p), not " + std::to_string(x));
            for (std::size_t j = 0; j < i; j++)
                if (points[j].operand == x)
                    throw std::invalid_argument("the xs must be distinct (" + std::to_string(x) +
                                                " twice)");
            points[i].set(x, modulus_);
        }
        const std::uint64_t *s = sec.data();
        py::array_t<std::uint64_t> out({count, n_});
        std::uint64_t *dst = out.mutable_data();
        {
            py::gil_scoped_release release;
            std::vector<std::uint64_t> r((t - 1) * n_);
            auto prng = seal::UniformRandomGeneratorFactory::DefaultFactory()->create();
            for (std::size_t d = 0; d + 1 < t; d++)
                seal::util::sample_poly_uniform(prng, parms_, r.data() + d * n_);
            parallel_ranges(count, threads, [&](std::size_t begin, std::size_t end) {
                for (std::size_t i = begin; i < end; i++) {
                    std::uint64_t *acc = dst + i * n_;
                    std::fill(acc, acc + n_, 0);
                    for (std::size_t d = t - 1; d >= 1; d--) {  // acc = (acc + r_d)·x
                        seal::util::add_poly_coeffmod(acc, r.data() + (d - 1) * n_, n_, modulus_,
                                                      acc);
                        seal::util::multiply_poly_scalar_coeffmod(acc, n_, points[i], modulus_,
                                                                  acc);
                    }
                    seal::util::add_poly_coeffmod(acc, s, n_, modulus_, acc);
                }
            });
            if (!r.empty()) seal::util::seal_memzero(r.data(), r.size() * sizeof(std::uint64_t));
        }
        return out;
    }

    // SEAL's forward (inverse) negacyclic NTT of each row of a (n,) or (rows, n) array
    py::array_t<std::uint64_t> ntt(py::array polys, bool inverse, std::size_t threads) const {
        auto arr = as_u64(polys, "polys");
        if (!((arr.ndim() == 1 || arr.ndim() == 2) &&
              arr.shape(arr.ndim() - 1) == static_cast<py::ssize_t>(n_)))
            throw std::invalid_argument("polys must have shape (n,) or (rows, n)");
        std::size_t rows = arr.ndim() == 2 ? static_cast<std::size_t>(arr.shape(0)) : 1;
        std::vector<py::ssize_t> shape(arr.shape(), arr.shape() + arr.ndim());
        py::array_t<std::uint64_t> out(shape);
        const std::uint64_t *src = arr.data();
        std::uint64_t *dst = out.mutable_data();
        {
            py::gil_scoped_release release;
            parallel_ranges(rows, threads, [&](std::size_t begin, std::size_t end) {
                for (std::size_t r = begin; r < end; r++) {
                    check_below(src + r * n_, n_, "polys");
                    std::copy(src + r * n_, src + (r + 1) * n_, dst + r * n_);
                    if (inverse)
                        seal::util::inverse_ntt_negacyclic_harvey(dst + r * n_, *tables_);
                    else
                        seal::util::ntt_negacyclic_harvey(dst + r * n_, *tables_);
                }
            });
        }
        return out;
    }

    // x·y in R_p, both (n,) in coefficient form: INTT(NTT(x) ⊙ NTT(y))
    py::array_t<std::uint64_t> multiply(py::array x, py::array y) const {
        std::vector<std::uint64_t> a = ntt_of(x, "x"), b = ntt_of(y, "y");
        py::array_t<std::uint64_t> out(n_);
        seal::util::dyadic_product_coeffmod(a.data(), b.data(), n_, modulus_, out.mutable_data());
        seal::util::inverse_ntt_negacyclic_harvey(out.mutable_data(), *tables_);
        return out;
    }

private:
    std::string checked_seed(py::bytes seed) const {
        std::string s = seed;
        if (s.size() != 32)
            throw std::invalid_argument("seed must be 32 bytes, not " + std::to_string(s.size()));
        return s;
    }

    void check_below(const std::uint64_t *d, std::size_t count, const char *what) const {
        const std::uint64_t p = modulus_.value();
        if (std::any_of(d, d + count, [p](std::uint64_t v) { return v >= p; }))
            throw std::invalid_argument(std::string(what) + ": a coefficient is not below p");
    }

    // a_b: uniform mod p from a Blake2xbPRNG seeded with blake2b-512(seed || b, 8 bytes LE);
    // read as NTT-domain values (uniform either way), as SEAL's seeded encryption does
    void expand(const std::string &seed, std::uint64_t block, std::uint64_t *a) const {
        unsigned char in[40];
        std::memcpy(in, seed.data(), 32);
        for (int i = 0; i < 8; i++) in[32 + i] = static_cast<unsigned char>(block >> (8 * i));
        seal::prng_seed_type derived;
        if (blake2b(derived.data(), seal::prng_seed_byte_count, in, sizeof(in), nullptr, 0) != 0)
            throw std::runtime_error("blake2b failed");
        auto prng = std::make_shared<seal::Blake2xbPRNG>(derived);
        seal::util::sample_poly_uniform(prng, parms_, a);
    }

    // NTT(poly) for a (n,) polynomial with coefficients below p
    std::vector<std::uint64_t> ntt_of(const py::array &poly, const std::string &what) const {
        auto arr = as_u64(poly, what);
        check_shape(arr, {static_cast<py::ssize_t>(n_)}, what, "(n,)");
        check_below(arr.data(), n_, what.c_str());
        std::vector<std::uint64_t> out(arr.data(), arr.data() + n_);
        seal::util::ntt_negacyclic_harvey(out.data(), *tables_);
        return out;
    }

    std::size_t n_;
    int log_n_ = 0;
    seal::Modulus modulus_;
    seal::EncryptionParameters parms_;
    std::unique_ptr<seal::util::NTTTables> tables_;
};

std::uint64_t ntt_prime(int bits, std::size_t n) {
    return seal::CoeffModulus::Create(n, {bits})[0].value();
}

}  // namespace

// Two modules from this one file: ``_seal_native`` (everything) and ``_seal_public``
// (SECAGG_PUBLIC_ONLY: the parameters, the seed expansion and sums, the threshold ring; no
// class that takes a key), which is all a server process loads.
#ifndef SECAGG_MODULE
#define SECAGG_MODULE _seal_native
#endif

PYBIND11_MODULE(SECAGG_MODULE, m) {
#ifdef SECAGG_PUBLIC_ONLY
    m.doc() = "secagg's public arithmetic over SEAL: seed expansion, sums mod q, the ring";
#else
    m.doc() = "secagg's batched, in-memory seeded CKKS encryption and seed expansion over SEAL";
#endif
    m.attr("SEAL_VERSION") = std::to_string(SEAL_VERSION_MAJOR) + "." +
                             std::to_string(SEAL_VERSION_MINOR) + "." +
                             std::to_string(SEAL_VERSION_PATCH);
    py::class_<Parameters>(m, "Parameters")
        .def(py::init<std::size_t, std::vector<int>>(), py::arg("n"), py::arg("coeff_bits"));
#ifndef SECAGG_PUBLIC_ONLY
    py::class_<UploadMasks>(m, "UploadMasks")
        .def_property_readonly("chunks", &UploadMasks::chunks)
        .def_property_readonly("used", &UploadMasks::used)
        .def("wipe", &UploadMasks::wipe);
    py::class_<FloodingNoise>(m, "FloodingNoise")
        .def_property_readonly("chunks", &FloodingNoise::chunks)
        .def_property_readonly("scale", &FloodingNoise::scale)
        .def_property_readonly("used", &FloodingNoise::used)
        .def("wipe", &FloodingNoise::wipe);
    py::class_<SecretKeyCKKS>(m, "SecretKeyCKKS")
        .def(py::init<const Parameters &, py::bytes>(), py::arg("parameters"),
             py::arg("secret_key"))
        .def_property_readonly("first_parms_id", &SecretKeyCKKS::first_parms_id)
        .def_property_readonly("ciphertext_bytes", &SecretKeyCKKS::ciphertext_bytes)
        .def("masks", &SecretKeyCKKS::masks, py::arg("chunks"), py::arg("threads"))
        .def("fresh_seeds", &SecretKeyCKKS::fresh_seeds, py::arg("chunks"))
        .def("masks_from", &SecretKeyCKKS::masks_from, py::arg("seeds"), py::arg("threads"))
        .def("encrypt_masked", &SecretKeyCKKS::encrypt_masked, py::arg("masks"),
             py::arg("values"), py::arg("scale"), py::arg("threads"))
        .def("encrypt", &SecretKeyCKKS::encrypt, py::arg("values"), py::arg("scale"),
             py::arg("threads") = 1)
        .def("open", &SecretKeyCKKS::open, py::arg("c0"), py::arg("c1"), py::arg("scale"),
             py::arg("noise"), py::arg("threads") = 1, py::arg("encoded") = nullptr)
        .def("encode_noise", &SecretKeyCKKS::encode_noise, py::arg("noise"), py::arg("scale"),
             py::arg("threads") = 1);
#endif
    py::class_<SeedExpander>(m, "SeedExpander")
        .def(py::init<const Parameters &>(), py::arg("parameters"))
        .def("sum", &SeedExpander::sum, py::arg("seeds"), py::arg("chunks"),
             py::arg("factors") = std::vector<std::int64_t>(), py::arg("threads") = 1)
        .def("combine", &SeedExpander::combine, py::arg("polys"), py::arg("factors"),
             py::arg("threads") = 1);
    py::class_<Ring>(m, "Ring")
        .def(py::init<std::size_t, std::uint64_t>(), py::arg("n"), py::arg("prime"))
        .def_property_readonly("n", &Ring::n)
        .def_property_readonly("p", &Ring::p)
        .def_property_readonly("bits", &Ring::bits)
        .def("key", &Ring::key)
        .def("public", &Ring::public_polys, py::arg("seed"), py::arg("blocks"),
             py::arg("threads") = 1)
        .def("mask", &Ring::mask, py::arg("key"), py::arg("seed"), py::arg("messages"),
             py::arg("threads") = 1)
        .def("unmask", &Ring::unmask, py::arg("total"), py::arg("key_sum"), py::arg("seed"),
             py::arg("threads") = 1)
        .def("combine", &Ring::combine, py::arg("polys"), py::arg("weights"),
             py::arg("threads") = 1)
        .def("shares", &Ring::shares, py::arg("secret"), py::arg("t"), py::arg("xs"),
             py::arg("threads") = 1)
        .def(
            "ntt",
            [](const Ring &r, py::array polys, std::size_t threads) {
                return r.ntt(polys, false, threads);
            },
            py::arg("polys"), py::arg("threads") = 1)
        .def(
            "intt",
            [](const Ring &r, py::array polys, std::size_t threads) {
                return r.ntt(polys, true, threads);
            },
            py::arg("polys"), py::arg("threads") = 1)
        .def("multiply", &Ring::multiply, py::arg("x"), py::arg("y"));
    m.def("ntt_prime", &ntt_prime, py::arg("bits"), py::arg("n"),
          "SEAL's CoeffModulus::Create(n, {bits})[0]: the largest NTT prime of that size");
}
