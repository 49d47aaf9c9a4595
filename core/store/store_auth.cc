#include "store_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <fstream>
#include <iterator>

#include "comms/error.h"
#include "config/env.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms::store_auth {
namespace {

std::string hmac_sha256(std::string_view key, std::string_view label, std::string_view server_nonce,
                        std::string_view client_nonce) {
  const std::string message = str::cat(label, server_nonce, client_nonce);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &out_len) == nullptr) {
    throw Error(ErrorCode::kInternal, "TCP store authentication: HMAC-SHA256 failed in libcrypto");
  }
  return std::string(reinterpret_cast<const char*>(out), out_len);
}

std::string read_token_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("COMMS_STORE_TOKEN_FILE='", path, "' is not a readable regular file"));
  }
  if (static_cast<size_t>(st.st_size) > kMaxTokenBytes) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("COMMS_STORE_TOKEN_FILE='", path, "' has ", st.st_size, " bytes; a token has at most ",
                         kMaxTokenBytes));
  }
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) {
    throw Error(ErrorCode::kInvalidArgument, str::cat("COMMS_STORE_TOKEN_FILE='", path, "' cannot be read"));
  }
  // A trailing newline from `echo token > file` is not part of the token.
  while (!text.empty() && str::is_space(text.back())) text.pop_back();
  if (text.empty()) {
    throw Error(ErrorCode::kInvalidArgument, str::cat("COMMS_STORE_TOKEN_FILE='", path, "' is empty"));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    log::warning(str::cat("COMMS_STORE_TOKEN_FILE='", path,
                          "' can be read by other users: chmod 600 it to keep the store's token secret"));
  }
  return text;
}

}  // namespace

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    throw Error(ErrorCode::kInternal, "TCP store authentication: RAND_bytes failed in libcrypto");
  }
  return out;
}

std::string new_token() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : random_bytes(32)) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

std::string client_proof(std::string_view token, std::string_view server_nonce, std::string_view client_nonce) {
  return hmac_sha256(token, "comms-store/1 client", server_nonce, client_nonce);
}

std::string server_proof(std::string_view token, std::string_view server_nonce, std::string_view client_nonce) {
  return hmac_sha256(token, "comms-store/1 server", server_nonce, client_nonce);
}

bool proofs_equal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string token_from_environment() {
  auto token = env::get("COMMS_STORE_TOKEN");
  auto file = env::get("COMMS_STORE_TOKEN_FILE");
  if (token && file) {
    throw Error(ErrorCode::kInvalidArgument,
                "COMMS_STORE_TOKEN and COMMS_STORE_TOKEN_FILE are both set; set only one");
  }
  if (token) {
    if (token->size() > kMaxTokenBytes) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("COMMS_STORE_TOKEN has ", token->size(), " bytes; a token has at most ", kMaxTokenBytes));
    }
    return *token;
  }
  if (file) return read_token_file(*file);
  return "";
}

}  // namespace comms::store_auth
