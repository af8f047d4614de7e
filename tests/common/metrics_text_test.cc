#include "common/metrics_text.h"

#include <gtest/gtest.h>

namespace pdserve {
namespace {

TEST(MetricsTextTest, FamiliesAreTypedOnceAndSamplesFollow) {
  MetricsText out;
  out.Counter("a_total", "Things.", 3)
      .Gauge("b", "Level.", 0.25)
      .Family("c_total", MetricType::kCounter, "By kind.")
      .Sample("c_total", {{"kind", "x"}}, 1)
      .Sample("c_total", {{"kind", "y"}, {"node", "n1"}}, 2);
  EXPECT_EQ(out.text(),
            "# HELP a_total Things.\n# TYPE a_total counter\na_total 3\n"
            "# HELP b Level.\n# TYPE b gauge\nb 0.25\n"
            "# HELP c_total By kind.\n# TYPE c_total counter\n"
            "c_total{kind=\"x\"} 1\nc_total{kind=\"y\",node=\"n1\"} 2\n");
}

TEST(MetricsTextTest, LabelValuesAreEscaped) {
  MetricsText out;
  out.Sample("m", {{"node", "a\"b\\c\nd"}}, 1);
  EXPECT_EQ(out.text(), "m{node=\"a\\\"b\\\\c\\nd\"} 1\n");
}

TEST(MetricsTextTest, HistogramIsCumulativeWithSumAndCount) {
  Histogram h({0.1, 1.0});
  h.Observe(0.05);
  h.Observe(0.5);
  h.Observe(5.0);
  const std::string text = MetricsText().Histogram("x", "help", h).text();
  EXPECT_EQ(text,
            "# HELP x help\n# TYPE x histogram\n"
            "x_bucket{le=\"0.1\"} 1\nx_bucket{le=\"1\"} 2\nx_bucket{le=\"+Inf\"} 3\n"
            "x_sum 5.55\nx_count 3\n");
}

}  // namespace
}  // namespace pdserve
