// The TCP store's shared secret and the challenge-response that proves it.
//
// Server and client each send a fresh random nonce; the client answers with
// HMAC-SHA256(token, "comms-store/1 client" || server_nonce || client_nonce)
// and the server with the same over "comms-store/1 server", so each side
// proves it knows the token without it ever crossing the wire, and a proof
// recorded from one connection is worthless on another. The primitives come
// from OpenSSL's libcrypto (HMAC, RAND_bytes, CRYPTO_memcmp).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace comms::store_auth {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;  // SHA-256
// A token file larger than this is not a token.
inline constexpr size_t kMaxTokenBytes = 4096;

// `n` bytes from the system's cryptographic generator. Throws
// comms::Error(kInternal) if it fails.
std::string random_bytes(size_t n);

// A fresh random token: 32 random bytes as 64 hex digits.
std::string new_token();

std::string client_proof(std::string_view token, std::string_view server_nonce,
                         std::string_view client_nonce);
std::string server_proof(std::string_view token, std::string_view server_nonce,
                         std::string_view client_nonce);

// Compares in time independent of where the inputs differ.
bool proofs_equal(std::string_view a, std::string_view b);

// COMMS_STORE_TOKEN, else the contents of the file named by
// COMMS_STORE_TOKEN_FILE (trailing white space removed), else "" (no
// authentication). Throws comms::Error(kInvalidArgument) naming the variable
// when both are set, or the file cannot be read, is empty or too large.
std::string token_from_environment();

}  // namespace comms::store_auth
