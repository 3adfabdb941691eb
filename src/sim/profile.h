#pragma once
// Quantities that change over time in steps and repeat: the grid's carbon
// intensity by the hour, spot capacity and its price. Read from a CSV with
// an `hour` column (rows every step, from hour 0, without gaps) or, for one
// column, the planner's one-value-per-line hourly file.

#include <string>
#include <vector>

namespace apiary::sim {

class Profile {
  public:
    Profile() = default;  // empty: holds no values
    Profile(double step_s, std::vector<double> values);
    static Profile constant(double value);

    bool empty() const { return v_.empty(); }
    double step_s() const { return step_; }
    const std::vector<double>& values() const { return v_; }
    double period_s() const { return step_ * double(v_.size()); }
    double at(double t) const;
    // Integral of the value over [t0, t1] (value x seconds); O(1).
    double integral(double t0, double t1) const;
    // The first step boundary strictly after t (where the value may change).
    double next_change(double t) const;
    double min() const;

  private:
    double cumulative(double t) const;  // integral over [0, t]
    double step_ = 3600;
    std::vector<double> v_;
    std::vector<double> prefix_;  // prefix_[k] = sum of v_[0..k)
    bool constant_ = false;
};

struct ProfileTable {
    std::string source;
    double step_s = 3600;
    std::vector<std::string> columns;         // as in the header, without `hour`
    std::vector<std::vector<double>> values;  // values[column][row]
    const std::vector<double>* column(const std::string& name) const;
};

// `required` columns must be present; any other column must be in `optional`.
// Negative values, gaps, a first row other than hour 0 and unknown columns
// are errors naming the line and field.
ProfileTable read_profile_table(const std::string& path, const std::vector<std::string>& required,
                                const std::vector<std::string>& optional = {});
ProfileTable parse_profile_table(const std::string& text, const std::string& source,
                                 const std::vector<std::string>& required,
                                 const std::vector<std::string>& optional = {});

}  // namespace apiary::sim
