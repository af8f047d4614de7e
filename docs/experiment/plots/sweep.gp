# Drawn by `pdserve bench sweep` from the .dat files beside this script.
# Draw again: cd into this directory, then `gnuplot sweep.gp`.
set terminal pngcairo size 960,600 noenhanced font ',11'
set grid
set key top left
set output 'itl_cdf.png'
set title 'Inter-token latency CDF at 0.05 req/s'
set xlabel 'inter-token latency (ms, log scale)'
set ylabel 'fraction of ITLs at or below'
set logscale x
set yrange [0:1.02]
set key bottom right
plot 'itl_cdf_1p1d.dat' using 1:2 with steps lw 2 lc 1 title '1p1d', \
     'itl_cdf_colocated.dat' using 1:2 with steps lw 2 lc 2 title 'colocated'
unset logscale x
set autoscale y
set key top left
set xtics ("0.025" 0.025, "0.05" 0.05, "0.075" 0.075, "0.1" 0.1)
set xrange [0:0.135]
set xlabel 'request rate (req/s)'
set output 'ttft_vs_rate.png'
set title 'TTFT versus request rate (solid: median, dashed: p99)'
set ylabel 'TTFT (ms, log scale)'
set logscale y
plot '1p1d_vs_rate.dat' using 1:3 with linespoints lw 2 pt 7 lc 1 dt 1 title '1p1d median', \
     '1p1d_vs_rate.dat' using 1:4 with linespoints lw 2 pt 7 lc 1 dt 2 title '1p1d p99', \
     'colocated_vs_rate.dat' using 1:3 with linespoints lw 2 pt 7 lc 2 dt 1 title 'colocated median', \
     'colocated_vs_rate.dat' using 1:4 with linespoints lw 2 pt 7 lc 2 dt 2 title 'colocated p99'
set output 'itl_vs_rate.png'
set title 'Inter-token latency versus request rate (solid: p99, dashed: median)'
set ylabel 'ITL (ms, log scale)'
plot '1p1d_vs_rate.dat' using 1:6 with linespoints lw 2 pt 7 lc 1 dt 1 title '1p1d p99', \
     '1p1d_vs_rate.dat' using 1:5 with linespoints lw 2 pt 7 lc 1 dt 2 title '1p1d median', \
     'colocated_vs_rate.dat' using 1:6 with linespoints lw 2 pt 7 lc 2 dt 1 title 'colocated p99', \
     'colocated_vs_rate.dat' using 1:5 with linespoints lw 2 pt 7 lc 2 dt 2 title 'colocated median'
unset logscale y
set yrange [0:*]
set output 'goodput_vs_rate.png'
set ylabel 'requests/s'
set title 'Goodput (solid) and throughput (dashed) versus request rate'
plot '1p1d_vs_rate.dat' using 1:8 with linespoints lw 2 pt 7 lc 1 dt 1 title '1p1d goodput', \
     '1p1d_vs_rate.dat' using 1:7 with linespoints lw 2 pt 7 lc 1 dt 2 title '1p1d throughput', \
     'colocated_vs_rate.dat' using 1:8 with linespoints lw 2 pt 7 lc 2 dt 1 title 'colocated goodput', \
     'colocated_vs_rate.dat' using 1:7 with linespoints lw 2 pt 7 lc 2 dt 2 title 'colocated throughput'
