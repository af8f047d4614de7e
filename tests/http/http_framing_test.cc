// Where a request ends (http/request_framing.h): heads and chunked bodies, each fed whole and a
// byte at a time.
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "http/request_framing.h"

namespace pdserve::http {
namespace {

// Scans `head` as it would arrive a byte at a time.
ScanState ScanByteByByte(std::string_view head, HeadScanner* scanner) {
  ScanState state = ScanState::kIncomplete;
  for (size_t n = 1; n <= head.size() && state == ScanState::kIncomplete; ++n) {
    state = scanner->Scan(head.substr(0, n));
  }
  return state;
}

TEST(HeadScannerTest, FindsTheEndOfAWellFormedHead) {
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Empty:\r\n\r\n";
  for (const bool byte_by_byte : {false, true}) {
    HeadScanner scanner;
    const ScanState state =
        byte_by_byte ? ScanByteByByte(head + "next", &scanner) : scanner.Scan(head + "next");
    EXPECT_EQ(state, ScanState::kComplete);
    EXPECT_EQ(scanner.head_size(), head.size());
  }
  HeadScanner partial;
  EXPECT_EQ(partial.Scan("GET / HTTP/1.1\r\nHost: x\r\n\r"), ScanState::kIncomplete);
}

TEST(HeadScannerTest, RefusesAtTheFirstBadByte) {
  for (const std::string& bad : std::vector<std::string>{
           "GET / HTTP/1.1\n", "GET / HTTP/1.1\rX", "\x16\x03\x01", "GET\r\n",
           "GE(T / HTTP/1.1\r\n", "GET / HTTP/1.1\r\n folded: x\r\n",
           "GET / HTTP/1.1\r\nName : x\r\n", "GET / HTTP/1.1\r\nNo colon\r\n",
           "GET / HTTP/1.1\r\n: x\r\n", "GET /\t HTTP/1.1\r\n", std::string(21, 'A')}) {
    HeadScanner scanner;
    EXPECT_EQ(ScanByteByByte(bad, &scanner), ScanState::kMalformed) << bad;
    EXPECT_STRNE(scanner.problem(), "");
  }
}

TEST(ParseFramingTest, ReadsTheBodyFraming) {
  auto framing = [](const std::string& headers) {
    return ParseFraming("POST / HTTP/1.1\r\n" + headers + "\r\n");
  };
  Result<RequestFraming> f = framing("");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->body, RequestFraming::Body::kNone);
  f = framing("content-length: 12\r\nExpect: 100-Continue\r\n");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->body, RequestFraming::Body::kLength);
  EXPECT_EQ(f->length, 12u);
  EXPECT_TRUE(f->expect_continue);
  f = framing("Transfer-Encoding:  Chunked \r\n");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->body, RequestFraming::Body::kChunked);
  f = framing("Content-Length: 99999999999999999999999\r\n");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->length, UINT64_MAX);
  for (const std::string bad :
       {"Content-Length: 1\r\nContent-Length: 1\r\n", "Content-Length: +1\r\n",
        "Content-Length: 1,1\r\n", "Content-Length:\r\n", "Transfer-Encoding: gzip\r\n",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
        "Content-Length: 1\r\nTransfer-Encoding: chunked\r\n"}) {
    EXPECT_FALSE(framing(bad).ok()) << bad;
  }
  EXPECT_FALSE(ParseFraming("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n").ok());
  EXPECT_FALSE(ParseFraming("POST  / HTTP/1.1\r\n\r\n").ok());
  EXPECT_FALSE(ParseFraming("POST / HTTP/1.2\r\n\r\n").ok());
  EXPECT_FALSE(ParseFraming("POST / x HTTP/1.1\r\n\r\n").ok());
}

TEST(ChunkedBodyScannerTest, DecodesWholeAndByteByByte) {
  const std::string encoded = "3;x=y\r\nabc\r\nA \r\n0123456789\r\n0\r\n\r\n";
  for (const bool byte_by_byte : {false, true}) {
    ChunkedBodyScanner scanner(100);
    std::string body;
    ChunkedBodyScanner::State state = ChunkedBodyScanner::State::kIncomplete;
    const std::string input = encoded + "GET / HTTP/1.1\r\n";
    if (byte_by_byte) {
      for (size_t i = 0; i < input.size() && state == ChunkedBodyScanner::State::kIncomplete; ++i) {
        state = scanner.Scan(std::string_view(input).substr(i, 1), &body);
      }
    } else {
      state = scanner.Scan(input, &body);
    }
    EXPECT_EQ(state, ChunkedBodyScanner::State::kComplete);
    EXPECT_EQ(body, "abc0123456789");
    EXPECT_EQ(scanner.encoded_size(), encoded.size());
  }
}

TEST(ChunkedBodyScannerTest, RefusesWhatHttplibWouldGuessAt) {
  for (const std::string bad :
       {"0x3\r\nabc\r\n0\r\n\r\n", "3\r\nabcXX\r\n0\r\n\r\n", "+3\r\nabc\r\n0\r\n\r\n",
        "3\nabc\r\n0\r\n\r\n", "0\r\nTrailer: x\r\n\r\n", ";x\r\n"}) {
    ChunkedBodyScanner scanner(100);
    std::string body;
    EXPECT_EQ(scanner.Scan(bad, &body), ChunkedBodyScanner::State::kMalformed) << bad;
  }
  ChunkedBodyScanner small(4);
  std::string body;
  EXPECT_EQ(small.Scan("3\r\nabc\r\n2\r\n", &body), ChunkedBodyScanner::State::kTooLarge);
  ChunkedBodyScanner huge_size(1 << 20);
  EXPECT_EQ(huge_size.Scan("ffffffffffffffffff\r\n", &body), ChunkedBodyScanner::State::kTooLarge);
}

}  // namespace
}  // namespace pdserve::http
